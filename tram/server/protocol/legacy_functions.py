"""Chat's deprecated `functions` and `function_call` fields, read as the `tools` and `tool_choice` they
became: `functions: [{name, description, parameters}]` is the tools list without its wrapping, and
`function_call` is "none", "auto" or `{"name": ...}` (a forced function).

vLLM does not know these fields (its request models log unknown fields and drop them, so a client
asking for a call gets text); Tram maps them, so older clients (LangChain's legacy function agents,
early SDK code) get the calls they ask for. The answer is chat's current one, `message.tool_calls` with finish_reason
"tool_calls", not OpenAI's legacy `message.function_call`: one shape for every call Tram returns.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from tram.server.tools.chat import FunctionDefinition


def _refuse(field: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_field", "'{field}': {why}", {"field": field, "why": why})


def _tools(functions: Any) -> list[dict[str, Any]]:
    if not isinstance(functions, list):
        raise _refuse("functions", "must be a list of function definitions")
    tools = []
    for i, function in enumerate(functions):
        try:
            FunctionDefinition.model_validate(function)
        except ValidationError as e:
            first = e.errors()[0]
            raise _refuse(".".join(str(p) for p in ("functions", i, *first["loc"])), first["msg"]) from None
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(function_call: Any) -> str | dict[str, Any]:
    if function_call in ("none", "auto"):
        return function_call
    if isinstance(function_call, dict) and set(function_call) == {"name"} and isinstance(function_call["name"], str):
        return {"type": "function", "function": {"name": function_call["name"]}}
    raise _refuse("function_call", 'must be "none", "auto" or {"name": <a function\'s name>}')


def map_legacy_functions(data: Any) -> Any:
    """A `model_validator(mode="before")` body: `functions` and `function_call` become `tools` and
    `tool_choice`; a request that sets both spellings of one setting is a 400 naming the old one."""
    if not isinstance(data, dict) or ("functions" not in data and "function_call" not in data):
        return data
    data = dict(data)
    functions, function_call = data.pop("functions", None), data.pop("function_call", None)
    if functions is not None:
        if data.get("tools"):  # (an empty list asks for nothing)
            raise _refuse("functions", "functions and tools cannot both be set: use tools")
        data["tools"] = _tools(functions)
    if function_call is not None:
        if data.get("tool_choice") is not None:
            raise _refuse("function_call", "function_call and tool_choice cannot both be set: use tool_choice")
        data["tool_choice"] = _tool_choice(function_call)
    return data
