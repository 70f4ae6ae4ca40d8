"""Connections bounded in time and in number, so that clients who connect and send nothing, or half
a request a byte at a time (slowloris), cannot hold the server's sockets (and file descriptors).

uvicorn closes a keep-alive connection that stays idle for --timeout-keep-alive seconds, but it
waits without limit for a request's headers: its keep-alive timer is not armed on a new connection,
and any byte stops it. So `GuardedHttpToolsProtocol` (uvicorn's httptools protocol, which `tram
serve` uses) adds one deadline: a request's headers must be complete within --timeout-read-headers
seconds of the connection opening or of the previous response ending; past it the client gets a 408
(if it had begun a request) and the connection is closed. The request body is the app's to read, so
its timeout is an ASGI middleware (body_timeout.py).

--limit-concurrency caps connections and requests in flight, as uvicorn's setting of that name, but
the 503 beyond it carries OpenAI's error body (uvicorn's is plain text no SDK can read). A held
connection counts until its deadline closes it, so the cap must leave room for those.

The process's soft limit on open files is raised to its hard limit at start, as vLLM does: every
connection is a file descriptor, and a soft limit of 1024 is reached long before memory or CPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tram.server.protocol.errors import error_body, error_response

logger = logging.getLogger(__name__)
_WARN_EVERY = 10.0  # seconds between two warnings that the cap is reached (a flood must not flood the log)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float  # seconds for a request's headers (--timeout-read-headers)
    max_concurrency: int | None  # connections and requests in flight (--limit-concurrency)


def raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response with OpenAI's body, for a connection that has no ASGI request
    to answer through (its headers never ended)."""
    body = json.dumps(error_body(status, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on request headers and a 503 with OpenAI's body
    beyond the concurrency cap. Configured per server by `protocol_class`."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # the cap is ours (on_headers_complete), with a JSON 503
        self.served_app = self.app
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_begun = False  # a byte of the next request has arrived (408 rather than a silent close)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_begun = True

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self.head_begun = False
        # uvicorn starts the request with `self.app`; beyond the cap that is the 503 instead.
        over = self._over_limit()
        self.app = _overloaded if over else self.served_app
        if over:
            _warn_overloaded(self.limits.max_concurrency)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a pipelined request's headers are already complete
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm_head_timer()

    def _over_limit(self) -> bool:
        cap = self.limits.max_concurrency
        # This connection is one of `connections`; the request about to start is not yet a task.
        return cap is not None and (len(self.connections) > cap or len(self.tasks) >= cap)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.head_begun:
            seconds = self.limits.header_timeout
            message = f"The request's headers did not arrive within {seconds:g} s (--timeout-read-headers)"
            self.transport.write(raw_error(408, "Request Timeout", message))
        self.transport.close()


_last_warning = -_WARN_EVERY


def _warn_overloaded(cap: int | None) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning >= _WARN_EVERY:
        _last_warning = now
        logger.warning("%d connections or requests in flight (--limit-concurrency): answering 503", cap)


async def _overloaded(scope: Any, receive: Any, send: Any) -> None:
    message = "The server is at its limit of concurrent connections (--limit-concurrency); retry later"
    await error_response(503, message, headers={"connection": "close", "retry-after": "1"})(scope, receive, send)


def protocol_class(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http` setting, bound to one server's limits."""
    return type("ServerHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (vLLM does the same at start);
    return the soft limit in force. A limit the system refuses to raise is logged and kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        logger.warning(
            "could not raise the open-file limit from %d to %d (%s): clients may run out of sockets", soft, hard, e
        )
        return soft
    return hard
