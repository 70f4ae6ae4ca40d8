"""One access log line per HTTP request, written when its response has ended:

    127.0.0.1:51234 "POST /v1/completions" 200 41.3 ms prompt_tokens=5 output_tokens=12

Method, path, status and latency from first byte in to last byte out; for a route that ran the
engine, the prompt and output tokens it handled (`tram.engine.usage`). A stream is logged when
its last chunk is sent, so its latency is the whole stream's; one that ends early (the client went
away) is marked `incomplete`. Successful probes (GET /health, /ping, /metrics: a load balancer or
Prometheus asks every few seconds) are not logged; their failures are. It replaces uvicorn's access
log, which knows no latency or tokens; `--disable-uvicorn-access-log` turns it off.

A plain ASGI middleware rather than Starlette's `BaseHTTPMiddleware`: that one returns when the
response starts, before a stream has sent anything.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tram.engine.usage import UsageCounter, track_usage

logger = logging.getLogger("tram.server.access")

Scope = dict[str, Any]
Message = dict[str, Any]
QUIET_PROBES = frozenset({"/health", "/ping", "/metrics"})


def format_access_line(scope: Scope, status: int, seconds: float, usage: UsageCounter, complete: bool) -> str:
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    line = f'{who} "{scope["method"]} {scope["path"]}" {status} {seconds * 1000:.1f} ms'
    if usage.requests:
        line += f" prompt_tokens={usage.prompt_tokens} output_tokens={usage.output_tokens}"
    return line if complete else line + " incomplete"


class AccessLogMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if the app fails before it answers
        ended = False

        async def send_and_watch(message: Message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True

        with track_usage() as usage:
            try:
                await self.app(scope, receive, send_and_watch)
            finally:
                if not (status == 200 and scope["method"] == "GET" and scope["path"] in QUIET_PROBES):
                    logger.info(format_access_line(scope, status, time.perf_counter() - start, usage, ended))
