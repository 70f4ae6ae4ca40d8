"""The grammar compiles' thread pool: `submit` as ThreadPoolExecutor's, but on daemon threads.

A compile that ran past its deadline has failed its request, yet its thread goes on until the
grammar engine returns (seconds, or minutes for a pathological schema). ThreadPoolExecutor joins its
workers when the interpreter exits, so the engine core, told to stop, would wait for that compile
until the API server killed it; daemon threads let it exit at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import Empty, SimpleQueue
from typing import Any


class CompilePool:
    def __init__(self, num_threads: int, name: str = "tram-grammar") -> None:
        self._queue: SimpleQueue[tuple[Future, Callable[..., Any], tuple] | None] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(num_threads)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - the future carries it to the request
                future.set_exception(e)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Cancel the compiles not started and let the threads end; a running compile is not waited for."""
        while True:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
