"""Server start-ups one module ahead: while a module's tests run against its `tram serve`, the server
of the next module that declares one (in the collected order) starts in a background thread, so its
start-up (seconds of imports and model loading, mostly on one core) overlaps with tests instead of
adding to them.

A module lists the servers it starts, in the order it takes them, at its top level:
`SERVERS = (SPEC,)` with `SPEC = ServerSpec(model, args)`. conftest.py's pytest_collection_finish
reads them into POOL's plan. A module fixture then takes its server with `yield from pool_server(SPEC)`
(checked at the module's end as server_utils.module_server checks: no request or KV block left, then
a clean exit); a test that stops or kills its server itself takes it with `POOL.take(SPEC)`.

Where a module's tests bound latencies tightly, it takes its server with `prefetch=False`: the next
server then starts when the module ends, not beside its tests. The plan's first server, and the
session's shared one (conftest.py's `stories_server`), start as the session begins. A server taken
without a plan (a spec no module declared) starts on the spot, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType

from server_utils import RemoteServer, stop_clean

__all__ = ["POOL", "ServerPool", "ServerSpec", "plan_from", "pool_server"]


@dataclass(frozen=True)
class ServerSpec:
    """How to start one `tram serve`: the model, its flags and what it adds to the environment."""

    model: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def start(self) -> RemoteServer:
        return RemoteServer(self.model, list(self.args), env=dict(self.env))


class _Starting:
    """A server starting in a daemon thread; `result()` waits for it, or raises what its start raised."""

    def __init__(self, spec: ServerSpec) -> None:
        self._server: RemoteServer | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(spec,), name="tram-serve-prefetch", daemon=True)
        self._thread.start()

    def _run(self, spec: ServerSpec) -> None:
        try:
            self._server = spec.start()
        except BaseException as err:  # noqa: BLE001 - raised again in the test that takes the server
            self._error = err

    def result(self) -> RemoteServer:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._server is not None
        return self._server


class ServerPool:
    """The session's plan of server start-ups and the ones already started ahead of their module."""

    def __init__(self) -> None:
        self.plan: list[ServerSpec] = []
        self._taken = 0  # plan entries before this one were taken (or passed over)
        self._ahead: dict[int, _Starting] = {}  # plan index -> its server, starting or started
        self._early: dict[ServerSpec, _Starting] = {}  # servers outside the plan, started at once

    def start_early(self, session_spec: ServerSpec | None) -> None:
        """At the session's start: the plan's first server, and `session_spec` (a session-scoped
        server's) if the session uses it, begin to start while the first tests run."""
        if self.plan:
            self.prefetch_after(-1)
        if session_spec is not None and session_spec not in self._early:
            self._early[session_spec] = _Starting(session_spec)

    def take(self, spec: ServerSpec, prefetch: bool = True) -> RemoteServer:
        """The server of `spec`, started ahead if the plan said so; with `prefetch`, the plan's next
        server starts now. The caller owns (stops) it."""
        index = self._claim(spec)
        if index is not None:
            self._drop_before(index)
            starting = self._ahead.pop(index, None)
        else:
            starting = self._early.pop(spec, None)
        server = starting.result() if starting is not None else spec.start()
        if prefetch:
            self.prefetch_after(index)
        return server

    def serve(self, spec: ServerSpec, prefetch: bool = True) -> Iterator[RemoteServer]:
        """The body of a module-scoped server fixture (`yield from pool_server(SPEC)`)."""
        index = self._claim(spec, peek=True)
        server = self.take(spec, prefetch)
        yield server
        if not prefetch:
            self.prefetch_after(index)
        stop_clean(server)

    def prefetch_after(self, index: int | None) -> None:
        """Start the server that the plan has after entry `index` (None: a server outside the plan)."""
        nxt = None if index is None else index + 1
        if nxt is not None and nxt < len(self.plan) and nxt not in self._ahead:
            self._ahead[nxt] = _Starting(self.plan[nxt])

    def close(self) -> None:
        """At the session's end: stop the servers started ahead that no test took (the session
        stopped early)."""
        self._drop_before(len(self.plan))
        for starting in self._early.values():
            _stop_quietly(starting)
        self._early.clear()

    def _drop_before(self, index: int) -> None:
        """Stop the servers started ahead for plan entries before `index`: their module was skipped."""
        for i in [i for i in self._ahead if i < index]:
            _stop_quietly(self._ahead.pop(i))

    def _claim(self, spec: ServerSpec, peek: bool = False) -> int | None:
        """The first plan entry from `_taken` on that is `spec` (taken unless `peek`), or None."""
        for i in range(self._taken, len(self.plan)):
            if self.plan[i] == spec:
                if not peek:
                    self._taken = i + 1
                return i
        return None


def _stop_quietly(starting: _Starting) -> None:
    try:
        starting.result().stop(strict=False)
    except Exception:  # noqa: BLE001 - its start already failed; nothing is left to stop
        pass


def plan_from(modules: Iterable[ModuleType]) -> list[ServerSpec]:
    """Every module's SERVERS, in the order of the modules."""
    return [spec for module in modules for spec in getattr(module, "SERVERS", ())]


POOL = ServerPool()
pool_server = POOL.serve
