"""What xgrammar's JSON-schema converter compiles as if it were absent, so that a schema relying on
it is refused with a 400 naming the keyword instead of a 200 whose output breaks the schema.

Found by probing xgrammar 0.2.8 with instances that break each keyword
(tests/engine/test_xgrammar_schema_support.py keeps the probes, and fails when an upgrade starts
enforcing one of these or stops enforcing another): it drops `not`, `if`/`then`/`else`,
`dependentSchemas`/`dependentRequired`/`dependencies`, `contains`, `uniqueItems`, dynamic
references, references other than JSON pointers into the schema and `format`s outside FORMATS;
`multipleOf` on numbers; length bounds beside `pattern` or `format`; string, number, array and
object bounds without a `type` naming their type; every assertion beside `$ref`, `enum`, `const`,
`anyOf`, `oneOf` or `allOf` (the lead keyword wins); all but the first schema of `allOf`; and
`required` properties that `properties` does not declare. (llguidance refuses what it cannot
enforce itself, so it needs no such list.) Left as vLLM leaves it: xgrammar compiles `oneOf` as
`anyOf`, so an output may match two of its schemas where the schema asks for exactly one.
"""

from __future__ import annotations

from typing import Any

from tram.sampling_params.schema_walk import subschemas

NEVER_ENFORCED = (
    "not",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "$dynamicRef",
    "$recursiveRef",
)
FORMATS = frozenset(
    {
        "date",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "json-pointer",
        "relative-json-pointer",
        "time",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
    }
)
# Bounds that constrain one type of value; xgrammar applies them only when `type` names that type.
BOUNDS_BY_TYPE = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("minItems", "maxItems"),
    "object": ("minProperties", "maxProperties"),
}
# Keywords that constrain an instance (the rest annotate it: title, description, default, $defs,
# ...). unevaluatedProperties and unevaluatedItems are not among them here: xgrammar's strict mode
# admits no property or item that the schema does not name, so they hold whatever they say.
ASSERTIONS = frozenset(
    {"type", "enum", "const", "required", "items", "prefixItems", "additionalItems", "properties"}
    | {"patternProperties", "additionalProperties", "propertyNames"}
    | {"allOf", "anyOf", "oneOf", "$ref", "uniqueItems", "if", "then", "else"}
    | {k for bounds in BOUNDS_BY_TYPE.values() for k in bounds}
    | set(NEVER_ENFORCED)
)
# A keyword that xgrammar follows alone, ignoring every assertion beside it.
LEADS = ("$ref", "enum", "const", "anyOf", "oneOf", "allOf")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


def unenforced(schema: Any) -> str | None:
    """The first thing in `schema` that xgrammar would not enforce, with where it is; None if none.
    Iterative, parents first, so a deep schema cannot exhaust the stack."""
    pending: list[tuple[str, str, Any]] = [("", "", schema)]
    while pending:
        path, keyword, node = pending.pop()
        if not isinstance(node, dict):
            continue
        if keyword == "propertyNames" and "type" not in node:
            node = {"type": "string", **node}  # what it constrains is a name: always a string
        problem = _node_problem(node)
        if problem is not None:
            return f"{problem} (at {path or 'the root'})"
        # A suffix starts with its keyword ("/properties/name"); keywords need no escaping.
        pending.extend((path + suffix, suffix.split("/")[1], sub) for suffix, sub in reversed(list(subschemas(node))))
    return None


def _node_problem(node: dict[str, Any]) -> str | None:
    for keyword in NEVER_ENFORCED:
        if keyword in node:
            return f"'{keyword}'"
    if "if" in node and ("then" in node or "else" in node):
        return "'if'/'then'/'else'"
    if node.get("uniqueItems") is True:
        return "'uniqueItems'"
    return _bounds_problem(node) or _lead_problem(node) or _required_problem(node)


def _types(node: dict[str, Any]) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    return {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else None


def _bounds_problem(node: dict[str, Any]) -> str | None:
    types = _types(node)
    for kind, keywords in BOUNDS_BY_TYPE.items():
        present = [k for k in keywords if k in node]
        if not present:
            continue
        if types is None:
            return f"'{present[0]}' without a \"type\" that names {kind}"
        if kind not in types and not (kind == "number" and "integer" in types):
            continue  # a bound for another type holds for every value this schema allows
        if kind == "number" and "multipleOf" in node and ("number" in types or not isinstance(node["multipleOf"], int)):
            return "'multipleOf' on a number that need not be an integer"
        if kind == "string":
            return _string_problem(node, present)
    return None


def _string_problem(node: dict[str, Any], present: list[str]) -> str | None:
    if "format" in node and node["format"] not in FORMATS:
        return f"'format': {node['format']!r}"
    for lead in ("format", "pattern"):
        others = [k for k in present if k not in (lead, "format")]
        if lead in node and others:
            return f"'{others[0]}' beside '{lead}'"
    return None


def _lead_problem(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        return f"'$ref' to {ref!r} (only JSON pointers within the schema, '#/...')"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "'allOf' with more than one schema"
    lead = next((k for k in LEADS if k in node), None)
    if lead is None:
        return None
    values_typed = lead in ("enum", "const")  # a "type" beside them is checked against the values
    others = [k for k in node if k in ASSERTIONS and k != lead and not (values_typed and k == "type")]
    if others:
        return f"'{others[0]}' beside '{lead}'"
    types = _types(node)
    if values_typed and types is not None:
        values = node["enum"] if lead == "enum" and isinstance(node["enum"], list) else [node.get(lead)]
        strays = [v for v in values if not _has_type(v, types)]
        if strays:
            return f"'{lead}' value {strays[0]!r} outside its \"type\""
    return None


def _has_type(value: Any, types: set[str]) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return "boolean" in types
    if isinstance(value, float) and value.is_integer() and "integer" in types:
        return True
    return any(isinstance(value, _JSON_TYPES.get(t, ())) for t in types)


def _required_problem(node: dict[str, Any]) -> str | None:
    required, declared = node.get("required"), node.get("properties")
    if not isinstance(required, list):
        return None
    declared = declared if isinstance(declared, dict) else {}
    missing = next((name for name in required if name not in declared), None)
    return None if missing is None else f"'required' {missing!r}, which \"properties\" does not declare"
