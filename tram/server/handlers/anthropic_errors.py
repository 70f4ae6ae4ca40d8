"""Errors as Anthropic's Messages API writes them: `{"type": "error", "error": {"type", "message"}}`,
the message beginning with the field it blames ("messages.1.content.0.type: ..."), since the body has
no `param`. The Anthropic routes answer every failure this way, their bodies' validation included:
a client's SDK reads the error type and message from exactly this shape."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from tram.server.http.large_json import LargeJSONRoute
from tram.server.protocol.errors import exception_to_error, field_path

# Anthropic's error types by status; a 5xx of any kind is its generic api_error.
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# Chat's names for the fields this API spells otherwise: errors raised by the chat machinery reach
# an Anthropic client in its own words.
_CHAT_NAMES = [
    (re.compile(r"\btools\.(\d+)\.function\.parameters\b"), r"tools.\1.input_schema"),
    (re.compile(r"\btools\.(\d+)\.function\.name\b"), r"tools.\1.name"),
    (re.compile(r"\bresponse_format(\.json_schema)?\b"), "output_config.format"),
    (re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
]
_CHAT_PARAMS = {"stop": "stop_sequences"}  # words too common to rename in a message's text


def error_type(status: int) -> str:
    if status >= 500:
        return "api_error"
    return _TYPES.get(status, "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def _in_anthropic_words(text: str) -> str:
    for pattern, name in _CHAT_NAMES:
        text = pattern.sub(name, text)
    return text


def validation_message(exc: RequestValidationError) -> str:
    """The first failure of a body's validation as "<field>: <why>"; with a union (a message's
    content is text or blocks) pydantic reports each member, and the deepest explains it."""
    errors = exc.errors()
    if not errors:
        return "invalid request body"
    # Of equally deep ones, a member's own rule (a list too short) says more than "not a string".
    first = max(errors, key=lambda e: (len(field_path(e.get("loc", ())) or ""), not e["type"].endswith("_type")))
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    if first.get("type") == "unsupported_field":  # field_error(): the message names its field
        return str(first["msg"])
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    where = field_path(first.get("loc", ())) or ""
    if first.get("type") == "union_tag_invalid":  # an unknown content block type: name its `type`
        where += ".type"
    return f"{where or 'the request body'}: {message}"


def anthropic_error(e: BaseException) -> tuple[int, str]:
    """(status, message) of a failure, the message naming its field."""
    if isinstance(e, RequestValidationError):
        return 400, validation_message(e)
    if isinstance(e, HTTPException):  # a body that is not JSON at all, among others
        return e.status_code, f"the request body: {e.detail}"
    err = exception_to_error(e)
    message = err.message
    if err.param and not message.startswith(f"{err.param}:"):
        message = f"{_CHAT_PARAMS.get(err.param, err.param)}: {message}"
    return err.status, _in_anthropic_words(message)


def error_response(e: BaseException) -> Response:
    status, message = anthropic_error(e)
    # ASCII-escaped: a message may quote a client's lone surrogate, which has no UTF-8 encoding.
    return Response(json.dumps(error_body(status, message)), status_code=status, media_type="application/json")


def error_event(e: BaseException) -> str:
    """The stream's `error` event, once the status line is gone."""
    status, message = anthropic_error(e)
    return f"event: error\ndata: {json.dumps(error_body(status, message))}\n\n"


class AnthropicRoute(LargeJSONRoute):
    """A route that answers its failures, from the body's validation on, in Anthropic's shape
    (the app's handlers would write OpenAI's)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as e:  # noqa: BLE001 - every failure is answered in this API's shape
                return error_response(e)

        return route


__all__ = ["AnthropicRoute", "error_body", "error_event", "error_response", "validation_message"]
