"""The grammar compile pool without a grammar engine: proofs that spin in their child process stand
for xgrammar's uninterruptible compiles (issue 35). A compile nobody waits for any more is killed at
once, an unstarted one never runs, a deadline ends its child, a new compile takes a slot from slow
ones within a quantum, and a child's error reaches the future with the request's field.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import GrammarCompileError
from tram.structured_output.compile_child import SLOW_NICE
from tram.structured_output.compile_pool import CompilePool
from tram.structured_output.compile_queues import MAX_PAUSED_PER_SLOT, QUANTUM_S


def params(regex: str) -> StructuredOutputsParams:
    return StructuredOutputsParams(regex=regex, source_field="guided_regex")


def prove(p: StructuredOutputsParams) -> tuple[str, int]:
    """In the child: "spin..." runs until killed, "bad..." raises as a grammar engine would,
    "sleep|hold <s>..." answers after s seconds, anything else at once, with its text and the child's pid."""
    assert p.regex is not None
    if p.regex.startswith(("sleep", "hold")):
        time.sleep(float(p.regex.split()[1]))
    if p.regex.startswith("spin"):
        while True:
            pass
    if p.regex.startswith("bad"):
        raise GrammarCompileError("guided_regex", "invalid regex: unbalanced")
    return p.regex, os.getpid()


FINISHED: list[str] = []
RELEASE = threading.Event()


def finish(p: StructuredOutputsParams, proof: tuple[str, int]) -> tuple[str, int]:
    """In this process: "hold ..." waits for RELEASE."""
    assert p.regex is not None
    FINISHED.append(p.regex)
    if p.regex.startswith("hold"):
        RELEASE.wait(30)
    return proof


@pytest.fixture
def pool() -> Iterator[CompilePool]:
    pool = CompilePool(finish, prove, slots=1)
    yield pool
    pool.shutdown()


def later(seconds: float) -> float:
    return time.monotonic() + seconds


def children() -> set[int]:
    """The compiles in flight: this process's live (not zombie) children that are forks of it (the
    same command line; the servers other test modules start in the background run another)."""
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        ours = f.read()
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and cmdline == ours:
            out.add(int(pid))
    return out


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_until(check, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()


def test_a_compile_nobody_waits_for_is_killed_and_a_queued_one_never_runs() -> None:
    pool = CompilePool(finish, prove, slots=1, quantum=60)  # no yielding here
    try:
        killed_and_never_run(pool)
    finally:
        pool.shutdown()


def killed_and_never_run(pool: CompilePool) -> None:
    before = children()
    spinning = pool.submit(("regex", "spin1"), params("spin1"), "r1", later(60))
    queued = pool.submit(("regex", "spin2"), params("spin2"), "r2", later(60))
    assert wait_until(lambda: len(children() - before) == 1)
    # Two requests share the spinning compile: it lives while either waits.
    assert pool.submit(("regex", "spin1"), params("spin1"), "r3", later(60)) is spinning
    pool.release(("regex", "spin1"), "r1")
    time.sleep(0.2)
    assert len(children() - before) == 1 and not spinning.done()
    pool.release(("regex", "spin2"), "r2")
    pool.release(("regex", "spin1"), "r3")
    assert wait_until(lambda: spinning.done() and queued.done())
    assert wait_until(lambda: not children() - before), "a child outlived its compile"
    assert isinstance(spinning.exception(), GrammarCompileError)


def nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def test_a_compile_past_its_quantum_drops_to_a_low_priority(pool: CompilePool) -> None:
    """Small compiles run at the engine's priority; one past its quantum yields the CPU to serving."""
    future = pool.submit(("regex", "spin6"), params("spin6"), "r1", later(60))
    assert wait_until(lambda: len(children()) == 1)
    (pid,) = children()
    assert nice_of(pid) == os.getpriority(os.PRIO_PROCESS, 0)
    assert wait_until(lambda: nice_of(pid) == SLOW_NICE, QUANTUM_S + 2)
    pool.release(("regex", "spin6"), "r1")
    assert isinstance(future.exception(timeout=5), GrammarCompileError)


def test_a_deadline_ends_the_child(pool: CompilePool) -> None:
    before = children()
    start = time.monotonic()
    future = pool.submit(("regex", "spin3"), params("spin3"), "r1", later(0.5))
    error = future.exception(timeout=5)
    assert isinstance(error, GrammarCompileError) and "took too long" in str(error)
    assert error.param == "guided_regex"
    assert 0.4 < time.monotonic() - start < 3
    assert wait_until(lambda: not children() - before)


def test_a_new_compile_takes_the_slot_of_a_slow_one(pool: CompilePool) -> None:
    """One slot, held by a spinning compile: a new one runs once the spinner used its quantum (the
    spinner is paused, not killed), and the spinner goes on after it."""
    slow = pool.submit(("regex", "spin4"), params("spin4"), "r1", later(60))
    time.sleep(QUANTUM_S)
    start = time.monotonic()
    fast: Future = pool.submit(("regex", "[a-z]"), params("[a-z]"), "r2", later(60))
    text, pid = fast.result(timeout=5)
    assert text == "[a-z]" and time.monotonic() - start < 2.5
    assert not slow.done()
    pool.release(("regex", "spin4"), "r1")
    assert isinstance(slow.exception(timeout=5), GrammarCompileError)
    assert not os.path.exists(f"/proc/{pid}") or state_of(pid) == "Z"


def test_many_slow_compiles_do_not_keep_a_new_one_waiting(pool: CompilePool) -> None:
    """Ten spinning compiles on one slot: each yields after its quantum, at most two stay paused
    (the rest end as too slow), and a small compile after them, the newest, waits a quantum at most."""
    slow = [pool.submit(("regex", f"spin-{i}"), params(f"spin-{i}"), f"s{i}", later(60)) for i in range(10)]
    time.sleep(QUANTUM_S * 3)
    start = time.monotonic()
    assert pool.submit(("regex", "x+"), params("x+"), "t", later(60)).result(timeout=10)[0] == "x+"
    assert time.monotonic() - start < QUANTUM_S + 1.5
    assert wait_until(lambda: len(children()) <= 1 + MAX_PAUSED_PER_SLOT)
    for i in range(10):
        pool.release(("regex", f"spin-{i}"), f"s{i}")
    assert wait_until(lambda: all(f.done() for f in slow) and not children())


def test_an_engine_error_reaches_the_future(pool: CompilePool) -> None:
    error = pool.submit(("regex", "bad("), params("bad("), "r1", later(10)).exception(timeout=5)
    assert isinstance(error, GrammarCompileError)
    assert (error.param, str(error)) == ("guided_regex", "invalid regex: unbalanced")


def test_without_proofs_compiles_run_on_threads() -> None:
    """llguidance bounds its own work: no child, the finish runs at once."""
    pool = CompilePool(lambda p, proof: (p.regex, proof), None, slots=1)
    try:
        assert pool.submit(("regex", "ab"), params("ab"), "r1", later(10)).result(timeout=5) == ("ab", None)
    finally:
        pool.shutdown()


def test_shutdown_kills_the_children_and_twice_is_harmless(pool: CompilePool) -> None:
    future = pool.submit(("regex", "spin5"), params("spin5"), "r1", later(60))
    assert wait_until(lambda: len(children()) == 1)
    pool.shutdown()
    assert future.done() and not children()
    pool.shutdown()


def test_a_finish_that_cannot_end_in_time_never_starts(pool: CompilePool) -> None:
    """A proof that took 0.6 s with 0.4 s left: the finish (about as long) would end past the
    deadline, so the requests fail at once and this process never compiles it."""
    start = time.monotonic()
    error = pool.submit(("regex", "sleep 0.6 a"), params("sleep 0.6 a"), "r1", later(1.0)).exception(timeout=5)
    assert isinstance(error, GrammarCompileError) and "took too long" in str(error)
    assert time.monotonic() - start < 1.0 and "sleep 0.6 a" not in FINISHED


def test_a_thread_stays_free_for_short_finishes() -> None:
    """Two threads, two grammars whose proofs were long (over short_proof) and whose finishes hold
    their thread until released: one finishes at a time, so a short one after them is done while
    the first still holds its thread."""
    # short_proof leaves "b+"'s proof (a fork and a pickle) a second even on a loaded machine; past
    # it, a proof counts as long and would rightly wait for a thread the held finishes keep.
    pool = CompilePool(finish, prove, slots=2, short_proof=1.0)
    RELEASE.clear()
    try:
        long = [pool.submit(("regex", f"hold 1.5 {i}"), params(f"hold 1.5 {i}"), f"l{i}", later(60)) for i in (1, 2)]
        assert wait_until(lambda: any(f"hold 1.5 {i}" in FINISHED for i in (1, 2)), timeout=10)
        assert pool.submit(("regex", "b+"), params("b+"), "s", later(60)).result(timeout=20)[0] == "b+"
        assert not any(f.done() for f in long)
        assert sum(f"hold 1.5 {i}" in FINISHED for i in (1, 2)) == 1, "both long finishes took a thread"
        RELEASE.set()
        assert all(f.result(timeout=20) for f in long)
    finally:
        RELEASE.set()
        pool.shutdown()
