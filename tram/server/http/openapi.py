"""The OpenAPI document, true to what the server answers: FastAPI documents 422 for a body that
fails validation, where Tram (as OpenAI) answers 400; error statuses carry OpenAI's error body; and
endpoints that stream document their stream's content type next to the JSON one."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
# Anthropic's Messages API answers errors in its own shape (server/handlers/anthropic_errors.py).
_ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ANTHROPIC_ERROR_REF = {"$ref": "#/components/schemas/AnthropicErrorResponse"}
_DESCRIPTIONS = {
    400: "Invalid request (OpenAI's invalid_request_error)",
    401: "Missing or wrong API key",
    404: "Unknown model or route",
    408: "The request body stopped arriving (--timeout-read-body)",
    413: "Request body too large (--max-request-body-bytes)",
    429: "Too many requests waiting (--max-queued-requests)",
    500: "The engine failed this request",
    503: "The engine is not running, or the server is at --limit-concurrency",
}
# Every route may meet a dead engine (503) or a missing key (401, /v1 only); a route with a body
# may also get a 400, 408 (a stalled body), 413, 404 (unknown model) or 429 (queue full).
_BODY_STATUSES = (400, 404, 408, 413, 429, 500, 503)
# One server-sent event (OpenAPI 3.2's reading of a text/event-stream body): `data` holds a JSON
# chunk, or "[DONE]" at the end of a completions stream.
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}
_STREAM_TYPES = {
    "/v1/completions": "text/event-stream",
    "/v1/chat/completions": "text/event-stream",
    "/v1/responses": "text/event-stream",
    "/v1/messages": "text/event-stream",
    "/generate": "application/x-ndjson",
}


def openapi_document(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorResponse"], schemas["AnthropicErrorResponse"] = _ERROR_SCHEMA, _ANTHROPIC_ERROR_SCHEMA
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                _document(path, method, operation)
        app.openapi_schema = schema
    return app.openapi_schema


def _document(path: str, method: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    statuses = list(_BODY_STATUSES if "requestBody" in operation or "parameters" in operation else (500, 503))
    if path.startswith("/v1"):
        statuses.append(401)
    error_ref = _ANTHROPIC_ERROR_REF if path.startswith("/v1/messages") else _ERROR_REF
    for status in statuses:
        responses[str(status)] = {
            "description": _DESCRIPTIONS[status],
            "content": {"application/json": {"schema": error_ref}},
        }
    stream_type = _STREAM_TYPES.get(path)
    ok = responses.get("200")
    if stream_type and ok is not None:
        schema = _SSE_EVENT if stream_type == "text/event-stream" else {"type": "string"}
        ok.setdefault("content", {})[stream_type] = {"schema": schema}
