"""The grammar compiles: one job per grammar (requests that ask for the same one share it), run so that
a compile nobody can use any more stops costing at once, and a burst of slow ones cannot hold every
slot.

A job belongs to the requests waiting for it (its waiters: request ids). When the last one is gone
(its request failed at its deadline, or was aborted) the job is dropped: one not started never runs,
one running in a child process is killed. Two stages:

- prove, for an engine whose compile cannot be interrupted (xgrammar): in a child process forked
  from the engine core (compile_child.py), at most `slots` running at once. The child compiles in
  full and hands back what the second stage needs (xgrammar: the converted grammar). Killed when its
  job is dropped or at its deadline, so its CPU and memory go back at once.
- finish: on one of `slots` threads of this process, the compile whose result the requests use.
  After a proof its cost is known (about the proof's), so the quickest proof goes first, a finish
  that could not end by the deadline never starts, and one thread is kept for short ones (a finish
  cannot be stopped); an engine that bounds its own work (llguidance) finishes without a proof.

Fairness, a multilevel feedback queue: a child that has held a slot for QUANTUM_S yields it (it is
paused, SIGSTOP) whenever a job not yet started waits, and continues when none does; jobs not yet
started go newest first. So a burst of slow schemas, from one client or many, keeps a new one
waiting a quantum at most, and the slow ones go on with the slots the new ones leave, until their
deadline. A paused child keeps its memory, so at most MAX_PAUSED_PER_SLOT per slot stay paused: past
that, the one that has held a slot longest is ended as too slow.
"""

from __future__ import annotations

import heapq
import itertools
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import GrammarCompileError
from tram.structured_output.compile_child import ChildCall

QUANTUM_S = 0.25  # seconds a child may hold a slot before it yields it to a job not yet started
# A paused child keeps its memory, and the pages the engine core writes while it lives are copied
# (copy-on-write: the child keeps the old ones), so few stay paused.
MAX_PAUSED_PER_SLOT = 2
SHORT_PROOF_S = 1.0  # a proof that held its slot less long is short: its finish has a thread kept free

Key = tuple[str, str]
Prove = Callable[[StructuredOutputsParams], Any]
Finish = Callable[[StructuredOutputsParams, Any], Any]


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
    ran: float = 0.0  # seconds its child held a slot before the last time it got one
    since: float = 0.0  # time.monotonic() when it last got a slot
    proof: Any = None

    def fail(self, reason: str) -> None:
        if not self.future.done():
            self.future.set_exception(GrammarCompileError(self.params.source_field or "structured_outputs", reason))


class CompilePool:
    def __init__(
        self,
        finish: Finish,
        prove: Prove | None,
        slots: int,
        quantum: float = QUANTUM_S,
        short_proof: float = SHORT_PROOF_S,
        observe: Callable[[float], None] | None = None,
        name: str = "tram-grammar",
    ) -> None:
        """`observe` is told the seconds of each compile that ended (its proof's and its finish's),
        whether the engine compiled or refused the grammar; not of those dropped or killed."""
        self._finish, self._prove, self.slots = finish, prove, slots
        self.quantum, self.short_proof = quantum, short_proof
        self._observe = observe or (lambda seconds: None)
        self._lock = threading.Lock()
        self._ready_cond = threading.Condition(self._lock)
        self._jobs: dict[Key, CompileJob] = {}  # jobs not done, by grammar
        self._fresh: deque[CompileJob] = deque()  # to prove, not started
        self._running: list[CompileJob] = []  # proving, their child holds a slot
        self._paused: deque[CompileJob] = deque()  # proving, their child yielded its slot
        self._ready: list[tuple[float, int, CompileJob]] = []  # heap: to finish, cheapest proof first
        self._closed = False
        self._long_finishes = 0  # threads finishing a grammar whose proof was not short
        self._seq = itertools.count()
        threads = [threading.Thread(target=self._finish_loop, name=f"{name}_{i}", daemon=True) for i in range(slots)]
        self._child_thread: threading.Thread | None = None
        if prove is not None:
            self._selector = selectors.DefaultSelector()
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self._selector.register(self._wake_r, selectors.EVENT_READ, None)
            self._child_thread = threading.Thread(target=self._child_loop, name=f"{name}-children", daemon=True)
            threads.append(self._child_thread)
        for t in threads:
            t.start()

    # ---- the engine core's thread -----------------------------------------------------------
    def submit(self, key: Key, params: StructuredOutputsParams, waiter: str, deadline: float) -> Future:
        """The future of grammar `key`, which `waiter` (a request id) waits for until `deadline`
        (time.monotonic()): the job in flight for it, or a new one."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.future.done():
                job = CompileJob(key, params, deadline, next(self._seq))
                self._jobs[key] = job
                if self._prove is None:
                    self._push_ready(job)
                else:
                    self._fresh.append(job)
            job.waiters.add(waiter)
            job.deadline = max(job.deadline, deadline)
            self._wake()
        return job.future

    def release(self, key: Key, waiter: str) -> None:
        """`waiter` waits no more (its request failed, ended or has its grammar). A job nobody waits
        for is dropped: never started if it had not, its child killed if it had."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None or waiter not in job.waiters:
                return
            job.waiters.discard(waiter)
            if not job.waiters:
                self._wake()

    def shutdown(self) -> None:
        """Drop every job: children killed, threads told to end (a finish running is not waited for).
        Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._wake()
            self._closed = True
            self._ready_cond.notify_all()
        if self._child_thread is not None:
            self._child_thread.join(timeout=5)
            with self._lock:
                os.close(self._wake_w)  # no _wake writes once closed, so the number is never reused

    def _wake(self) -> None:
        """Under the lock: rouse the children's thread."""
        if self._prove is not None and not self._closed:
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the pipe is full: a wake-up is pending anyway
                pass

    # ---- the finish threads -----------------------------------------------------------------
    def _push_ready(self, job: CompileJob) -> None:
        heapq.heappush(self._ready, (job.ran, job.seq, job))
        self._ready_cond.notify()

    def _finish_loop(self) -> None:
        while True:
            with self._ready_cond:
                job = self._next_ready()
                while job is None and not self._closed:
                    self._ready_cond.wait()
                    job = self._next_ready()
                if job is None:
                    return
                is_long = job.ran >= self.short_proof
                self._long_finishes += int(is_long)
            start = time.monotonic()
            try:
                result = self._finish(job.params, job.proof)
            except BaseException as e:  # noqa: BLE001 - the future carries it to the requests
                job.future.set_exception(e)
            else:
                job.future.set_result(result)
            self._observe(job.ran + time.monotonic() - start)
            with self._lock:
                self._forget(job)
                self._long_finishes -= int(is_long)
                if is_long:
                    self._ready_cond.notify_all()  # another thread may take a long one now

    def _next_ready(self) -> CompileJob | None:
        """Under the lock: the job this thread finishes next, quickest proof first; None when there
        is none it may take. It can take a long one only while another thread stays free for short
        ones (a finish cannot be stopped once begun), and drops the jobs that cannot be of use: no
        one waits, or the finish would end past the deadline (it takes about what the proof took)."""
        while self._ready and not self._closed:
            ran, _, job = self._ready[0]
            if ran >= self.short_proof and self._long_finishes >= max(1, self.slots - 1):
                return None
            heapq.heappop(self._ready)
            if not job.waiters:
                job.fail("nobody waits for this compile any more")
            elif time.monotonic() + job.ran > job.deadline:
                job.fail(too_long_message(job.params.kind))
            else:
                return job
            self._forget(job)
        return None

    def _forget(self, job: CompileJob) -> None:
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]

    # ---- the children's thread --------------------------------------------------------------
    # Decisions are taken under the lock; forks, signals and reaping happen outside it, so that the
    # engine core's thread (submit, release) never waits for a fork.
    def _child_loop(self) -> None:
        while True:
            with self._lock:
                closed = self._closed
            if closed:
                break
            timeout = self._plan(time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    self._drain_wake()
                else:
                    self._collect(key.data)
        with self._lock:
            doomed = [(job, "the engine is shutting down") for job in self._take_all()]
        self._end(doomed)
        self._selector.close()
        os.close(self._wake_r)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _plan(self, now: float) -> float | None:
        """Drop what nobody can use, let slow children yield to new jobs, fill the slots; the
        seconds until the next thing to look at (None: nothing to do until woken)."""
        with self._lock:
            doomed = self._take_unwanted(now)
            paused, too_slow = self._take_yielding(now)
            started, resumed = self._take_slots(now)
            timeout = self._next_wake(now)
        self._end(doomed + too_slow)
        for job in paused:
            assert job.child is not None
            job.child.pause()
        for job in resumed:
            assert job.child is not None
            job.child.resume()
        for job in started:
            self._start(job)
        return timeout

    def _take_all(self) -> list[CompileJob]:
        jobs = [*self._fresh, *self._running, *self._paused]
        for job in jobs:
            self._unqueue(job)
            self._forget(job)
        return jobs

    def _take_unwanted(self, now: float) -> list[tuple[CompileJob, str]]:
        doomed = []
        for job in [*self._fresh, *self._running, *self._paused]:
            if not job.waiters:
                doomed.append((job, "nobody waits for this compile any more"))
            elif now > job.deadline:
                doomed.append((job, too_long_message(job.params.kind)))
        for job, _ in doomed:
            self._unqueue(job)
            self._forget(job)
        return doomed

    def _take_yielding(self, now: float) -> tuple[list[CompileJob], list[tuple[CompileJob, str]]]:
        """While a job not yet started waits and no slot is free, the running child furthest past its
        quantum yields (to pause); past MAX_PAUSED_PER_SLOT, the paused one that held a slot longest
        is ended."""
        paused: list[CompileJob] = []
        too_slow: list[tuple[CompileJob, str]] = []
        while self._fresh and len(self._running) >= self.slots:
            over = [
                j for j in self._running if j.child is not None and (j.demoted or j.ran + now - j.since >= self.quantum)
            ]
            if not over:
                break
            victim = max(over, key=lambda j: j.ran + now - j.since)
            victim.demoted, victim.ran = True, victim.ran + now - victim.since
            self._running.remove(victim)
            self._paused.append(victim)
            paused.append(victim)
        while len(self._paused) > MAX_PAUSED_PER_SLOT * self.slots:
            doomed = max(self._paused, key=lambda j: j.ran)
            self._unqueue(doomed)
            self._forget(doomed)
            if doomed in paused:
                paused.remove(doomed)
            kind = doomed.params.kind
            reason = f"compiling the {kind} constraint took too long while other compiles waited; simplify the schema"
            too_slow.append((doomed, reason))
        return paused, too_slow

    def _take_slots(self, now: float) -> tuple[list[CompileJob], list[CompileJob]]:
        """Free slots to jobs not yet started first, the newest first (it waits at most a quantum
        however many came before it, and the oldest are the nearest to their deadline anyway),
        then to paused ones, the oldest first: (to start, to resume)."""
        started, resumed = [], []
        while len(self._running) < self.slots and (self._fresh or self._paused):
            job = self._fresh.pop() if self._fresh else self._paused.popleft()
            (resumed if job.child is not None else started).append(job)
            job.since = now
            self._running.append(job)
        return started, resumed

    def _next_wake(self, now: float) -> float | None:
        jobs = [*self._fresh, *self._running, *self._paused]
        if not jobs:
            return None
        wake = min(j.deadline for j in jobs) - now
        if self._fresh:  # when the next running child reaches its quantum
            wake = min([wake, *(j.since + self.quantum - j.ran - now for j in self._running if not j.demoted)])
        return max(0.0, wake)

    def _start(self, job: CompileJob) -> None:
        assert self._prove is not None
        try:
            child = ChildCall(self._prove, (job.params,))
        except OSError as e:  # no process could be started (memory, the process limit)
            with self._lock:
                self._unqueue(job)
                self._forget(job)
            job.fail(f"could not start a compile process: {e}")
            return
        job.child = child
        self._selector.register(child.fd, selectors.EVENT_READ, job)

    def _collect(self, job: CompileJob) -> None:
        """The child of `job` has written: once its answer is whole, the job goes on to finish."""
        child = job.child
        if child is None or not child.read():
            return
        self._selector.unregister(child.fd)
        ok, value = child.result()
        job.child = None
        with self._lock:
            if job in self._running:
                job.ran += time.monotonic() - job.since
            self._unqueue(job)
            if ok and job.waiters:
                job.proof = value
                self._push_ready(job)
                return
            self._forget(job)
        if not ok:
            self._observe(job.ran)
            param, message = value
            if not job.future.done():
                job.future.set_exception(GrammarCompileError(param or "structured_outputs", message))
        else:
            job.fail("nobody waits for this compile any more")

    def _unqueue(self, job: CompileJob) -> None:
        for queue in (self._fresh, self._running, self._paused):
            if job in queue:
                queue.remove(job)

    def _end(self, doomed: list[tuple[CompileJob, str]]) -> None:
        """Kill the children of jobs already taken out of the queues, and fail them."""
        for job, reason in doomed:
            if job.child is not None:
                self._selector.unregister(job.child.fd)
                job.child.kill()
                job.child = None
            job.fail(reason)
