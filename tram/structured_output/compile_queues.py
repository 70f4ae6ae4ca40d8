"""Which grammar proofs run, yield, drop to a low priority or end: the compile pool's policy, over
its three queues, with no thread, process or signal of its own (compile_pool.py acts on what these
methods take out, outside its lock).

A multilevel feedback queue: a proof's child starts at the step loop's priority and drops to a low one
after LOWER_AFTER_S; once it has held its slot for QUANTUM_S it yields the slot (it is paused) whenever
a job not yet started waits, and continues when none does; jobs not yet started go newest first. So a
burst of slow schemas, from one client or many, keeps a new one waiting a quantum at most, and the
slow ones go on with the slots the new ones leave, until their deadline.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import GrammarCompileError
from tram.structured_output.compile_child import ChildCall

QUANTUM_S = 0.25  # seconds a child may hold a slot before it yields it to a job not yet started
LOWER_AFTER_S = 0.1  # seconds a child runs at the step loop's priority (most compiles end sooner)
# A paused child keeps its memory, and the pages the engine core writes while it lives are copied
# (copy-on-write: the child keeps the old ones), so few stay paused: past this many per slot, the
# one that has held a slot longest is ended as too slow.
MAX_PAUSED_PER_SLOT = 2

Key = tuple[str, str]
Doomed = list[tuple["CompileJob", str]]  # jobs to end, and why


def too_long_message(kind: str) -> str:
    return (
        f"compiling the {kind} constraint took too long (the limit is set by "
        "--structured-outputs-compile-timeout); simplify the schema"
    )


@dataclass(eq=False)
class CompileJob:
    key: Key
    params: StructuredOutputsParams
    deadline: float  # time.monotonic(): the latest of its waiters' deadlines
    seq: int
    waiters: set[str] = field(default_factory=set)
    future: Future = field(default_factory=Future)
    child: ChildCall | None = None
    demoted: bool = False  # used its quantum and yielded once: any job not yet started goes first
    lowered: bool = False  # ran past LOWER_AFTER_S: its child runs at a low priority
    ran: float = 0.0  # seconds its child held a slot before the last time it got one
    since: float = 0.0  # time.monotonic() when it last got a slot
    proof: Any = None

    def fail(self, reason: str) -> None:
        if not self.future.done():
            self.future.set_exception(GrammarCompileError(self.params.source_field or "structured_outputs", reason))

    def held(self, now: float) -> float:
        """Seconds its child has held a slot, now included (if it holds one)."""
        return self.ran + now - self.since


class ProofQueues:
    """Jobs to prove: `fresh` (not started), `running` (their child holds one of `slots`) and
    `paused` (their child yielded its slot). Each `take_*` moves jobs as decided and returns what
    the caller must do to their children."""

    def __init__(self, slots: int, quantum: float = QUANTUM_S) -> None:
        self.slots, self.quantum = slots, quantum
        self.fresh: deque[CompileJob] = deque()
        self.running: list[CompileJob] = []
        self.paused: deque[CompileJob] = deque()

    def all(self) -> list[CompileJob]:
        return [*self.fresh, *self.running, *self.paused]

    def unqueue(self, job: CompileJob) -> None:
        for queue in (self.fresh, self.running, self.paused):
            if job in queue:
                queue.remove(job)

    def take_all(self) -> list[CompileJob]:
        jobs = self.all()
        for job in jobs:
            self.unqueue(job)
        return jobs

    def take_unwanted(self, now: float) -> Doomed:
        """Jobs nobody waits for, or past their deadline: to end."""
        doomed = []
        for job in self.all():
            if not job.waiters:
                doomed.append((job, "nobody waits for this compile any more"))
            elif now > job.deadline:
                doomed.append((job, too_long_message(job.params.kind)))
        for job, _ in doomed:
            self.unqueue(job)
        return doomed

    def take_to_lower(self, now: float) -> list[CompileJob]:
        """Running children past LOWER_AFTER_S, to lower: a small compile runs at the priority of
        the step loop (as fast as a thread would), a slow one on the CPU that serving leaves."""
        lowered = [j for j in self.running if not j.lowered and j.held(now) >= LOWER_AFTER_S]
        for job in lowered:
            job.lowered = True
        return lowered

    def take_yielding(self, now: float) -> tuple[list[CompileJob], Doomed]:
        """While a job not yet started waits and no slot is free, the running child furthest past its
        quantum yields (to pause); past MAX_PAUSED_PER_SLOT, the paused one that held a slot longest
        is ended: (to pause, to end)."""
        paused: list[CompileJob] = []
        while self.fresh and len(self.running) >= self.slots:
            over = [j for j in self.running if j.child is not None and (j.demoted or j.held(now) >= self.quantum)]
            if not over:
                break
            victim = max(over, key=lambda j: j.held(now))
            victim.demoted, victim.ran = True, victim.held(now)
            self.running.remove(victim)
            self.paused.append(victim)
            paused.append(victim)
        too_slow: Doomed = []
        while len(self.paused) > MAX_PAUSED_PER_SLOT * self.slots:
            doomed = max(self.paused, key=lambda j: j.ran)
            self.unqueue(doomed)
            if doomed in paused:
                paused.remove(doomed)
            kind = doomed.params.kind
            reason = f"compiling the {kind} constraint took too long while other compiles waited; simplify the schema"
            too_slow.append((doomed, reason))
        return paused, too_slow

    def take_slots(self, now: float) -> tuple[list[CompileJob], list[CompileJob]]:
        """Free slots to jobs not yet started first, the newest first (it waits at most a quantum
        however many came before it, and the oldest are the nearest to their deadline anyway),
        then to paused ones, the oldest first: (to start, to resume)."""
        started, resumed = [], []
        while len(self.running) < self.slots and (self.fresh or self.paused):
            job = self.fresh.pop() if self.fresh else self.paused.popleft()
            (resumed if job.child is not None else started).append(job)
            job.since = now
            self.running.append(job)
        return started, resumed

    def next_wake(self, now: float) -> float | None:
        """Seconds until something is to be decided (None: nothing until a job comes or goes)."""
        jobs = self.all()
        if not jobs:
            return None
        wake = min(j.deadline for j in jobs) - now
        # When the next running child is to be lowered, or reaches its quantum (to let a new job in).
        wake = min([wake, *(j.since + LOWER_AFTER_S - j.ran - now for j in self.running if not j.lowered)])
        if self.fresh:
            wake = min([wake, *(j.since + self.quantum - j.ran - now for j in self.running if not j.demoted)])
        return max(0.0, wake)
