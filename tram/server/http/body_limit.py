"""Request bodies over --max-request-body-bytes are refused with 413 and OpenAI's error body, before
they are read whole, parsed or tokenized.

A pure ASGI middleware: a Content-Length over the limit is answered at once, without reading a byte;
a body without one (chunked) is counted as it arrives, and the read that passes the limit raises an
HTTPException(413), which the route's exception handler turns into the error body. (FastAPI's own
`max_body_size` answers a declared oversize in plain text, which no OpenAI client can parse.)
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tram.server.protocol.errors import error_response


def body_too_large_message(max_bytes: int) -> str:
    return f"The request body is larger than this server accepts ({max_bytes} bytes; --max-request-body-bytes)"


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(413, body_too_large_message(self.max_bytes), headers={"connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, body_too_large_message(self.max_bytes))
            return message

        await self.app(scope, counting_receive, send)
