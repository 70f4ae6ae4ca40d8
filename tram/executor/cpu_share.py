"""The default thread count that follows the machine: every usable core while no other process uses
them, one core less while one does (the planner's rules: tram/executor/cpu_threads.py).

Why: an OpenMP parallel region ends only when its slowest thread does, so a process that takes a
core from one of the model's threads stalls every region (many times the time between tokens at its
tail, docs/benchmarks.md "Sharing the machine"), while on a free machine the last core is worth
1.3-1.6x at one request on a 2-core machine. Neither fixed count is right for both, so the engine
watches: every `interval_s` of stepping it reads, from /proc, how much CPU time the usable cores
spent on processes other than its own (the engine core and, under `tram serve`, its API server) and
picks the count for the next steps. Two thresholds keep it from flapping: it gives the core up when
others used `busy_above` of a core over the last interval and takes it back only below `free_below`.
A window spans steps only: the first step after the engine idled starts a new one (what others did
while it idled, or while the model loaded, says little about the steps to come, and a window over a
server's start once took the core away from a free machine).

Torch-free and cheap: two clock reads per step; a sample (three small /proc reads) twice a second
while the engine steps, nothing while it idles. Where /proc cannot be read (not Linux) nothing is
watched and the count stays at the one beside a busy process, the safe side. Threads are the
process's (torch.set_num_threads), so is the watch: `install` it once where the model runs in this
process, `before_step` and `after_step` around every step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Columns of a /proc/stat cpu line that are work done on that CPU (user, nice, system, irq, softirq);
# idle, iowait and steal (time the hypervisor ran someone else) are not, and guest time is in user.
_BUSY_COLUMNS = (0, 1, 2, 5, 6)


def busy_ticks(cpus: Iterable[int], stat_path: str = "/proc/stat") -> int:
    """Clock ticks the given CPUs spent working since boot, for whatever process."""
    wanted = {f"cpu{c}" for c in cpus}
    total = 0
    with open(stat_path, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name in wanted:
                columns = rest.split()
                total += sum(int(columns[i]) for i in _BUSY_COLUMNS)
    return total


def process_ticks(pid: int) -> int:
    """Clock ticks a process (all its threads) has run, user and system; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


@dataclass
class CpuShareWatch:
    """Picks `full` threads or `shared` ones from what other processes used of the usable cores."""

    full: int
    shared: int
    own_pids: tuple[int, ...]
    cpus: tuple[int, ...]
    interval_s: float = 0.5
    busy_above: float = 0.5
    free_below: float = 0.25
    clock: Callable[[], float] = time.monotonic
    read_busy: Callable[[tuple[int, ...]], int] = busy_ticks
    read_own: Callable[[tuple[int, ...]], int] = field(default=lambda pids: sum(process_ticks(p) for p in pids))
    threads: int = 0
    stepped_at: float | None = None  # when the last step ended; None before the first
    others: float = 0.0  # cores other processes used over the last window
    window_s: float = 0.0  # the last window's length (an interval or more: it closes at a step)
    _last: tuple[float, int, int] | None = None

    def __post_init__(self) -> None:
        self.threads = self.threads or self.full
        self._last = self._sample()

    def _sample(self) -> tuple[float, int, int]:
        return self.clock(), self.read_busy(self.cpus), self.read_own(self.own_pids)

    def step_ended(self) -> None:
        self.stepped_at = self.clock()

    def poll(self) -> int:
        """The thread count for the next step: re-decided once per interval of stepping."""
        assert self._last is not None
        now = self.clock()
        if self.stepped_at is None or now - self.stepped_at >= self.interval_s:
            self._last = self._sample()  # the engine idled (or never stepped): a new window from here
            return self.threads
        if now - self._last[0] < self.interval_s:
            return self.threads
        sample = self._sample()
        elapsed = sample[0] - self._last[0]
        others_ticks = (sample[1] - self._last[1]) - (sample[2] - self._last[2])
        self._last = sample
        self.others, self.window_s = max(0.0, others_ticks / (elapsed * CLOCK_TICKS)), elapsed
        if self.threads == self.full and self.others >= self.busy_above:
            self.threads = self.shared
        elif self.threads == self.shared and self.others < self.free_below:
            self.threads = self.full
        return self.threads


_watch: CpuShareWatch | None = None
_set_threads: Callable[[int], None] | None = None
# A switch is logged at INFO at most this often (a load that comes and goes would fill the log).
LOG_EVERY_S = 30.0
_last_info = -LOG_EVERY_S


def install(
    full: int, shared: int, own_pids: tuple[int, ...], set_threads: Callable[[int], None]
) -> CpuShareWatch | None:
    """Start following the machine in this process: `set_threads` (torch.set_num_threads) is called
    with the new count whenever it changes, before the step that uses it. None, with `shared`
    threads set, where /proc cannot be read."""
    global _watch, _set_threads
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(range(full))
    try:
        _watch = CpuShareWatch(full, shared, own_pids, cpus)
    except OSError as e:
        uninstall()
        set_threads(shared)
        logger.info("CPU threads for the model fixed at %d: what other processes use cannot be read (%s)", shared, e)
        return None
    _set_threads = set_threads
    set_threads(_watch.threads)
    return _watch


def uninstall() -> None:
    global _watch, _set_threads
    _watch = _set_threads = None


def installed() -> CpuShareWatch | None:
    return _watch


def after_step() -> None:
    if _watch is not None:
        _watch.step_ended()


def before_step() -> None:
    """Apply the watch's count for this step (nothing where no watch is installed)."""
    global _last_info
    if _watch is None or _set_threads is None:
        return
    current = _watch.threads
    threads = _watch.poll()
    if threads != current:
        _set_threads(threads)
        now = time.monotonic()
        level = logging.INFO if now - _last_info >= LOG_EVERY_S else logging.DEBUG
        _last_info = now if level == logging.INFO else _last_info
        logger.log(
            level,
            "CPU threads for the model %d -> %d: other processes used %.2f cores over the last %.1f s",
            current,
            threads,
            _watch.others,
            _watch.window_s,
        )
