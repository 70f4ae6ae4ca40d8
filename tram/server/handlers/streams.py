"""Async plumbing for handlers: merging per-prompt streams, and noticing clients that went away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

T = TypeVar("T")

DONE_EVENT = "data: [DONE]\n\n"
# nginx's "client closed request": nobody reads it, but the access log shows what happened.
_CLIENT_CLOSED = 499


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def merge_async_iterators(*iterators: AsyncIterator[T]) -> AsyncIterator[tuple[int, T]]:
    """Yield (index, item) from several iterators as items arrive. Leaving early (or an error in
    one of them) closes all of them, which aborts their requests in the engine."""
    if len(iterators) == 1:
        it = iterators[0]
        try:
            async for item in it:
                yield 0, item
        finally:
            await it.aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None, bool]] = asyncio.Queue()

    async def drain(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                await queue.put((i, item, None, False))
            await queue.put((i, None, None, True))
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, e, True))

    tasks = [asyncio.create_task(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item, error, done = await queue.get()
            if error is not None:
                raise error
            if done:
                remaining -= 1
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def gather_or_cancel(awaitables: list[Awaitable[T]]) -> list[T]:
    """All results, or on any failure or cancellation none: unlike plain `asyncio.gather`, the
    others are cancelled (and awaited, so closing their engine streams has aborted their requests)
    before the error goes on."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run a non-streaming handler, cancelling it if the client disconnects first (the cancellation
    closes its engine streams, which aborts the requests and frees their KV blocks)."""
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if handler.done():
        return handler.result()
    handler.cancel()
    await asyncio.gather(handler, return_exceptions=True)
    return None


async def respond_unless_disconnected(request: Request, work: Awaitable[dict[str, Any]]) -> Response:
    """The JSON body `work` builds, or 499 when the client went away first (the work is cancelled)."""
    body = await run_until_disconnected(request, work)
    return JSONResponse(body) if body is not None else Response(status_code=_CLIENT_CLOSED)
