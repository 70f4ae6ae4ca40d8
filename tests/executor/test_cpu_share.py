"""The default thread count follows the machine (tram/executor/cpu_share.py): every core while other
processes leave them free, one fewer while one is busy, re-decided once per interval with two
thresholds. The decisions run on fake clocks and counters; /proc is read for real where a busy
process is started beside the test. No timing of the model here (docs/benchmarks.md has those)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tram.executor import cpu_share
from tram.executor.cpu_share import CLOCK_TICKS, CpuShareWatch, busy_ticks, process_ticks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


class FakeMachine:
    """A clock and tick counters the test moves by hand: `others` and `own` in cores over a step."""

    def __init__(self) -> None:
        self.now, self.busy, self.own = 0.0, 0, 0

    def advance(self, seconds: float, others: float, own: float = 1.0) -> None:
        self.now += seconds
        self.own += round(own * seconds * CLOCK_TICKS)
        self.busy += round((own + others) * seconds * CLOCK_TICKS)

    def watch(self, full: int = 2, shared: int = 1) -> CpuShareWatch:
        return CpuShareWatch(
            full,
            shared,
            own_pids=(1,),
            cpus=(0, 1),
            clock=lambda: self.now,
            read_busy=lambda cpus: self.busy,
            read_own=lambda pids: self.own,
        )


def steps(machine: FakeMachine, watch: CpuShareWatch, seconds: float, others: float, step_s: float = 0.1) -> int:
    """Steps back to back for `seconds` while other processes use `others` cores; then the count the
    next step gets."""
    for _ in range(round(seconds / step_s)):
        watch.poll()
        machine.advance(step_s, others)
        watch.step_ended()
    return watch.poll()


def test_gives_a_core_up_while_another_process_is_busy_and_takes_it_back() -> None:
    machine = FakeMachine()
    watch = machine.watch()
    assert watch.poll() == 2
    assert steps(machine, watch, 0.6, others=0.9) == 1  # a busy neighbour; our own time never counts
    assert watch.others == pytest.approx(0.9, abs=0.05)
    assert steps(machine, watch, 0.6, others=0.0) == 2


def test_two_thresholds_keep_it_from_flapping() -> None:
    machine = FakeMachine()
    watch = machine.watch(full=8, shared=7)
    assert steps(machine, watch, 0.6, others=0.4) == 8  # light load (a client, a shell): keep every core
    assert steps(machine, watch, 0.6, others=0.6) == 7
    assert steps(machine, watch, 0.6, others=0.35) == 7  # between the thresholds: stays where it is
    assert steps(machine, watch, 0.6, others=0.1) == 8


def test_decides_once_per_interval_of_stepping() -> None:
    machine = FakeMachine()
    watch = machine.watch()
    watch.poll()
    assert steps(machine, watch, 0.2, others=2.0) == 2  # too soon: no decision yet
    assert steps(machine, watch, 0.4, others=0.0) == 1  # the window's average: 2.0 x 0.2 s / 0.6 s


def test_a_window_never_spans_idle_time() -> None:
    """What others did while the engine idled (or loaded its model) does not decide the next steps."""
    machine = FakeMachine()
    watch = machine.watch()
    machine.advance(30.0, others=1.5, own=0.0)  # a server's start beside other work, no step yet
    assert steps(machine, watch, 0.3, others=0.0) == 2
    assert steps(machine, watch, 0.3, others=0.0) == 2
    machine.advance(10.0, others=1.0, own=0.0)  # idle between requests, a neighbour busy meanwhile
    assert steps(machine, watch, 0.3, others=0.0) == 2 and watch.others < 0.25


def test_before_step_applies_a_change_once(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = FakeMachine()
    calls: list[int] = []
    monkeypatch.setattr(cpu_share, "_watch", machine.watch())
    monkeypatch.setattr(cpu_share, "_set_threads", calls.append)
    for _ in range(8):  # 0.8 s of steps beside a busy process
        cpu_share.before_step()
        machine.advance(0.1, others=1.0)
        cpu_share.after_step()
    assert calls == [1]


def test_before_step_without_a_watch_does_nothing() -> None:
    cpu_share.uninstall()
    cpu_share.before_step()
    assert cpu_share.installed() is None


def test_reads_proc_stat_for_the_given_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  100 0 100 900 0 0 0 0 0 0\n"
        "cpu0 10 1 20 400 50 3 4 100 0 0\n"
        "cpu1 5 0 5 500 0 0 0 0 0 0\n"
        "cpu10 1000 0 0 0 0 0 0 0 0 0\n"
    )
    assert busy_ticks((0,), str(stat)) == 10 + 1 + 20 + 3 + 4  # not idle, iowait nor steal
    assert busy_ticks((0, 1), str(stat)) == 38 + 10
    assert busy_ticks((1,), str(stat)) == 10  # cpu1, not cpu10


def test_process_ticks_of_a_process_that_is_gone_is_zero() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_ticks(child.pid) == 0
    assert process_ticks(os.getpid()) > 0  # this test process has run


def test_sees_a_busy_process_on_the_real_machine() -> None:
    """A process spinning beside us shows up in /proc as other processes' time; ours does not."""
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    watch = CpuShareWatch(len(cpus) + 1, len(cpus), own_pids=(os.getpid(),), cpus=cpus, interval_s=0.5)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # the interpreter's start is its own time too; only steady spinning is wanted
        watch.step_ended()
        watch.poll()  # a window starts at this step
        for _ in range(6):
            time.sleep(0.1)  # "steps" that leave the cores to the spinner
            watch.step_ended()
        assert watch.poll() == len(cpus) and watch.others >= 0.6
    finally:
        spinner.kill()
        spinner.wait()


def test_without_proc_the_count_stays_at_the_shared_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc cannot be read (not Linux) nothing is watched: the safe count, beside a busy process."""

    def unreadable(*args: object) -> CpuShareWatch:
        return CpuShareWatch(*args, read_busy=lambda cpus: busy_ticks(cpus, "/nonexistent/stat"))  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_share, "CpuShareWatch", unreadable)
    calls: list[int] = []
    try:
        assert cpu_share.install(4, 3, (os.getpid(),), calls.append) is None
        assert calls == [3] and cpu_share.installed() is None
    finally:
        cpu_share.uninstall()
