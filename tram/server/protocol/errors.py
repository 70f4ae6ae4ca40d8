"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tram.engine.async_llm import QueueFullError, RequestFailedError
from tram.engine.core_client import EngineDeadError
from tram.engine.input_processor import PromptTooLongError

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",  # the request never arrived whole (a read timeout)
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """Raised by handlers; becomes an error response with this status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "")),
            "param": param,
            "code": code if code is not None else status,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    # ASCII-escaped: a message may quote a client's lone surrogate, which has no UTF-8 encoding.
    body = json.dumps(error_body(status, message, param, code)).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def exception_to_error(e: BaseException) -> APIError:
    """Map an exception from validation or the engine to the status a client should see."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, PromptTooLongError):
        return APIError(400, str(e), e.param, e.code)
    if isinstance(e, (ValueError, TypeError)):
        return APIError(400, str(e), getattr(e, "param", None))
    if isinstance(e, QueueFullError):
        return APIError(429, str(e))
    if isinstance(e, EngineDeadError):
        return APIError(503, f"The engine is not running: {e}")
    if isinstance(e, RequestFailedError):
        return APIError(500, f"The engine failed this request: {e}")
    logger.exception("unexpected error while serving a request", exc_info=e)
    return APIError(500, f"Internal server error: {type(e).__name__}: {e}")


def stream_error_event(e: BaseException) -> str:
    err = exception_to_error(e)
    return f"data: {json.dumps(error_body(err.status, err.message, err.param, err.code))}\n\n"


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def field_path(loc: tuple) -> str | None:
    """'messages.0.content' from pydantic's location, without the tags it adds for union members
    and validators ('function-after[check_text(), str]', 'list[int]')."""
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request body", None
    # With a union (a prompt is text or token ids) pydantic reports one error per member; the one
    # that got deepest into the value is the one that explains what is wrong.
    first = max(errors, key=lambda e: len(field_path(e.get("loc", ())) or ""))
    kind, param = first.get("type"), field_path(first.get("loc", ()))
    if kind == "json_invalid":
        return "The request body is not valid JSON", None
    if kind == "unsupported_field":
        return first["msg"], first["ctx"]["field"]
    if kind == "extra_forbidden":
        return f"Unknown field '{param}': Tram does not support it", param
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    where = f" (at '{param}')" if param else ""
    return f"Invalid request{where}: {message}", param


def install_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        # Keeps the exception's headers: a 405 must say which methods are allowed.
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> Response:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    async def _other(_: Request, exc: Exception) -> Response:
        err = exception_to_error(exc)
        return error_response(err.status, err.message, err.param, err.code)

    # Starlette sends a handler registered for `Exception` to ServerErrorMiddleware, which re-raises
    # after responding, so uvicorn logs a traceback and closes the keep-alive connection: the
    # client's next request on it fails with a connection reset. Errors that are the client's fault
    # (ValueError from validation) or expected (queue full, engine dead) get their own handlers,
    # which run in ExceptionMiddleware and leave the connection usable.
    for expected in (ValueError, TypeError, QueueFullError, EngineDeadError, RequestFailedError):
        app.add_exception_handler(expected, _other)
    app.add_exception_handler(Exception, _other)  # anything else: a 500, logged as a bug
