"""tool_choice "required" or a named function: a JSON-schema grammar (applied elsewhere) makes the
model write exactly the calls, so there is no format to recognise, only a schema to build and a
grammar-valid output to read back.

- A named function: the output is its arguments object, so the schema is the function's
  parameters.
- "required": the output is an array of one or more `{"name": ..., "parameters": {...}}` objects,
  each naming one of the tools and holding that tool's parameters; with parallel_tool_calls false,
  one such object alone.

Every shape has an end the model must reach: a model that never picks "]" over "," (stories260K
never does) would otherwise write calls until max_tokens and return none. So the array holds at
most one call per tool offered: an agent's step rarely needs more, and the bound follows from the
request, where a fixed one would be too tight for many tools and too loose for one. Once the
array is full, or the one call written, the grammar allows nothing but the end token.
"""

from __future__ import annotations

import json
from typing import Any

from tram.sampling_params.schema_walk import iterate_schemas
from tram.server.tools.parsers.base import ToolCall, collect_deltas
from tram.server.tools.parsers.forced_stream import ForcedToolStream, forced_function_name

__all__ = ["ForcedToolStream", "forced_tool_schema", "parse_forced_tool_calls"]


def forced_tool_schema(
    tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], parallel: bool | None = None
) -> dict[str, Any] | None:
    """The JSON schema the output must follow; None when tool_choice forces nothing ("none",
    "auto"). `parallel` is the request's parallel_tool_calls: False makes "required" one call.
    ValueError for a named function that is not among `tools`, or "required" with none."""
    if tool_choice in ("none", "auto"):
        return None
    functions = {f["name"]: f for f in map(_function, tools)}
    name = forced_function_name(tool_choice)
    if name is None:
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        defs: dict[str, Any] = {}
        items = [_item_schema(n, f, defs) for n, f in functions.items()]
        schema: dict[str, Any] = (
            {"anyOf": items}
            if parallel is False
            else {"type": "array", "minItems": 1, "maxItems": len(items), "items": {"anyOf": items}}
        )
        return {**schema, "$defs": defs} if defs else schema
    if name not in functions:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return _parameters(functions[name])


def parse_forced_tool_calls(text: str, tool_choice: str | dict[str, Any]) -> list[ToolCall]:
    """The calls a (grammar-valid) forced output makes; ValueError if it is not of that shape."""
    stream = ForcedToolStream(tool_choice)
    _, calls = collect_deltas([stream.feed(text), stream.finish()])
    if stream.malformed:
        shape = "an arguments object" if forced_function_name(tool_choice) else "a call or an array of calls"
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


def _item_schema(name: str, function: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One call's schema. Parameters with local references ("#/$defs/Address", what pydantic writes
    for a nested model; "#" for a recursive one) are moved whole into the array's `$defs` under the
    function's name, each reference rebased onto their new place: nested in the array as they are,
    "#/$defs/..." would point at the array's root, which has no such definitions."""
    parameters = _parameters(function)
    if _has_local_ref(parameters):
        defs[name] = _rebase_refs(parameters, f"#/$defs/{name}")  # names match [a-zA-Z0-9_.-]: no escaping
        parameters = {"$ref": f"#/$defs/{name}"}
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def _has_local_ref(schema: Any) -> bool:
    return any(_local_ref(node) is not None for _, node in iterate_schemas(schema))


def _local_ref(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref if isinstance(ref, str) and ref.startswith("#") else None


def _rebase_refs(schema: Any, base: str) -> Any:
    """A copy of `schema` whose local references ("#...") point below `base` instead of the root."""
    copy = json.loads(json.dumps(schema))  # C-level copy: plan_tools bounded the depth already
    for _, node in iterate_schemas(copy):
        ref = _local_ref(node)
        if ref is not None:
            node["$ref"] = base + ref[1:]
    return copy
