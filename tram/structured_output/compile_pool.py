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

Which proofs run, yield, drop to a low priority or end is compile_queues.py's policy (a multilevel
feedback queue): a burst of slow schemas cannot keep a small one waiting for more than a quantum.
"""

from __future__ import annotations

import heapq
import itertools
import os
import selectors
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import GrammarCompileError
from tram.structured_output.compile_child import ChildCall
from tram.structured_output.compile_queues import QUANTUM_S, CompileJob, Doomed, Key, ProofQueues, too_long_message

SHORT_PROOF_S = 1.0  # a proof that held its slot less long is short: its finish has a thread kept free

Prove = Callable[[StructuredOutputsParams], Any]
Finish = Callable[[StructuredOutputsParams, Any], Any]


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
        self.short_proof = short_proof
        self._observe = observe or (lambda seconds: None)
        self._lock = threading.Lock()
        self._ready_cond = threading.Condition(self._lock)
        self._jobs: dict[Key, CompileJob] = {}  # jobs not done, by grammar
        self._queues = ProofQueues(slots, quantum)  # jobs to prove (compile_queues.py decides)
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
                    self._queues.fresh.append(job)
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
            doomed = [(job, "the engine is shutting down") for job in self._queues.take_all()]
            self._forget_all(doomed)
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
            queues = self._queues
            doomed = queues.take_unwanted(now)
            lowered = queues.take_to_lower(now)
            paused, too_slow = queues.take_yielding(now)
            started, resumed = queues.take_slots(now)
            timeout = queues.next_wake(now)
            self._forget_all(doomed + too_slow)
        self._end(doomed + too_slow)
        for job in lowered:
            if job.child is not None:
                job.child.lower_priority()
        for job in paused:
            assert job.child is not None
            job.child.pause()
        for job in resumed:
            assert job.child is not None
            job.child.resume()
        for job in started:
            self._start(job)
        return timeout

    def _start(self, job: CompileJob) -> None:
        assert self._prove is not None
        try:
            child = ChildCall(self._prove, (job.params,))
        except OSError as e:  # no process could be started (memory, the process limit)
            with self._lock:
                self._queues.unqueue(job)
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
            if job in self._queues.running:
                job.ran = job.held(time.monotonic())
            self._queues.unqueue(job)
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

    def _forget_all(self, doomed: Doomed) -> None:
        for job, _ in doomed:
            self._forget(job)

    def _end(self, doomed: Doomed) -> None:
        """Kill the children of jobs already taken out of the queues, and fail them."""
        for job, reason in doomed:
            if job.child is not None:
                self._selector.unregister(job.child.fd)
                job.child.kill()
                job.child = None
            job.fail(reason)
