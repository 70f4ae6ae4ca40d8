"""tool_choice "required" or a named function: a JSON-schema grammar (applied elsewhere) makes the
model write exactly the calls, so there is no format to recognise, only a schema to build and a
grammar-valid output to read back.

- A named function: the output is its arguments object, so the schema is the function's
  parameters.
- "required": the output is an array of one or more `{"name": ..., "parameters": {...}}` objects,
  each naming one of the tools and holding that tool's parameters.
"""

from __future__ import annotations

from typing import Any

from tram.server.tools.parsers.base import ToolCall, collect_deltas
from tram.server.tools.parsers.forced_stream import ForcedToolStream, forced_function_name

__all__ = ["ForcedToolStream", "forced_tool_schema", "parse_forced_tool_calls"]


def forced_tool_schema(tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the output must follow; None when tool_choice forces nothing ("none",
    "auto"). ValueError for a named function that is not among `tools`, or "required" with none."""
    if tool_choice in ("none", "auto"):
        return None
    functions = {f["name"]: f for f in map(_function, tools)}
    name = forced_function_name(tool_choice)
    if name is None:
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        items = [_item_schema(n, f) for n, f in functions.items()]
        return {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if name not in functions:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return _parameters(functions[name])


def parse_forced_tool_calls(text: str, tool_choice: str | dict[str, Any]) -> list[ToolCall]:
    """The calls a (grammar-valid) forced output makes; ValueError if it is not of that shape."""
    stream = ForcedToolStream(tool_choice)
    _, calls = collect_deltas([stream.feed(text), stream.finish()])
    if stream.malformed:
        shape = "an arguments object" if forced_function_name(tool_choice) else "an array of calls"
        raise ValueError(f"the output of a forced tool choice is not {shape}: {text[:200]!r}")
    return calls


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function" or not isinstance(function.get("name"), str):
        raise ValueError(f"not a function tool: {tool!r}")
    return function


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters")
    return {"type": "object", "properties": {}} if parameters is None else parameters


def _item_schema(name: str, function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [name]}, "parameters": _parameters(function)},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
