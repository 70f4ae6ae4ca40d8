"""A request body that stops arriving is answered with 408 and its connection closed, instead of
holding the connection (and the request's task) until the client gives up.

A pure ASGI middleware around `receive`: while the body is incomplete, each read may wait at most
--timeout-read-body seconds for the next piece (nginx's client_body_timeout: the time between two
reads, so a large body on a slow link still arrives). The read that waits too long raises an
HTTPException(408), which the route's exception handler turns into OpenAI's error body, as
body_limit.py does for a body too large. Once the body is complete, `receive` only waits for the
client to disconnect (streams listen for that), which takes as long as it takes.
"""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def body_timeout_message(seconds: float) -> str:
    return f"The request body stopped arriving: nothing came for {seconds:g} s (--timeout-read-body)"


class BodyReadTimeout:
    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout(self.timeout):
                    message = await receive()
            except TimeoutError:
                # `connection: close`: the rest of the body may still come, and must not be read as
                # the next request.
                raise HTTPException(408, body_timeout_message(self.timeout), headers={"connection": "close"}) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed_receive, send)
