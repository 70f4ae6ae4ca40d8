"""A parameter's value as Qwen3-Coder writes it (bare text inside `<parameter=...>`), made a JSON
value by the type its tool's schema declares, as vLLM's qwen3_coder parser does: `null` is null
for any type; a parameter the schema does not declare, a string type or no type stays text; an
integer or number that parses is a number (a number with no fraction an integer); a boolean is
`true` when the text is "true" (any case), else false; an object or array is parsed as JSON, then
as a Python literal; any other declared type is tried as a Python literal. Text that does not
convert stays text. Python literals are read with `ast.literal_eval`, never evaluated, and only
those with a JSON equivalent are kept.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

from tram.server.tools.parsers.python_call import json_literal

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_BOOL_TYPES = ("boolean", "bool", "binary")


def declared_type(schema: object) -> str:
    """The parameter's JSON-schema type, lowercased ("string" when it declares none); of a list of
    types, the first that is not "null"."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return str(kind).strip().lower() if kind is not None else "string"


def convert_param(value: str, properties: dict[str, Any] | None, name: str) -> Any:
    """`value` as the JSON value the tool's `properties` make of parameter `name`."""
    if value.lower() == "null":
        return None
    if not properties or name not in properties:
        return value
    kind = declared_type(properties[name])
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        return _number(value)
    if kind in _BOOL_TYPES:
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            pass
    return _literal(value)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _number(value: str) -> Any:
    try:
        number = float(value)
    except ValueError:
        return value
    if not math.isfinite(number):
        return value
    return int(number) if number.is_integer() else number


def _literal(value: str) -> Any:
    try:
        return json_literal(ast.parse(value.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return value
