"""Large JSON request bodies parsed off the event loop.

A 450 KB schema takes ~10 ms to parse and as long again to check (sampling_params/json_scan.py);
twenty arriving together held every other client, /health included, for half a second. Parsed and
checked in a worker thread, they hand the GIL back to the event loop at each switch interval (5 ms)
instead. Small bodies, nearly all of them, stay on the loop: a thread hop costs more than they do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute

T = TypeVar("T")

# Past this many bytes a body is parsed, and its sampling parameters built, in a worker thread.
LARGE_BODY_BYTES = 64 * 1024


def is_large(request: Request) -> bool:
    """Whether the request declared a body past LARGE_BODY_BYTES (a chunked one declares none)."""
    length = request.headers.get("content-length", "")
    return length.isdigit() and int(length) > LARGE_BODY_BYTES


async def off_loop_if_large(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, in a worker thread for a large request's body (its schemas are walked there)."""
    if is_large(request):
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


class LargeJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await asyncio.to_thread(json.loads, body) if len(body) > LARGE_BODY_BYTES else json.loads(body)
        return self._json


class LargeJSONRoute(APIRoute):
    """A route whose request body, when large, is parsed in a worker thread (FastAPI's handler reads
    it through `Request.json`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(LargeJSONRequest(request.scope, request.receive))

        return route
