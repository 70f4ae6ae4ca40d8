"""The subschemas of a JSON schema, by position: what the server (tool-call schemas) and the grammar
engines' checks (tram/structured_output/) walk.

A walk by keys alone goes wrong both ways: in `"properties": {"enum": {...}}` the key `enum` is a
property's name, not the keyword, and in `"const": {"$ref": "x"}` the `$ref` is data. Only the
positions JSON Schema (2020-12, and draft 7's `definitions`, `dependencies`, array `items` and
`additionalItems`) gives to schemas are followed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# keyword -> a schema, a list of schemas, or a map of names to schemas.
SCHEMA_VALUED = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SCHEMA_MAPS = frozenset({"$defs", "definitions", "dependencies", "dependentSchemas", "patternProperties", "properties"})


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def subschemas(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(JSON pointer suffix, subschema) for each position of `node` that holds a schema."""
    for key, value in node.items():
        here = f"/{_escape(key)}"
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield f"{here}/{_escape(name)}", sub
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield f"{here}/{i}", sub
        elif key in SCHEMA_VALUED:
            yield here, value


def iterate_schemas(root: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, schema object) for `root` and every object subschema under it, parents first.
    Iterative, so a deep schema cannot exhaust the stack; boolean schemas are not objects and are
    skipped (so are lists of property names under `dependencies`)."""
    pending: list[tuple[str, Any]] = [("", root)]
    while pending:
        path, node = pending.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        pending.extend((path + suffix, sub) for suffix, sub in reversed(list(subschemas(node))))


def resolve_pointer(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` ("#", "#/$defs/A") names; KeyError when there is none."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise KeyError(ref)
    node = root
    for raw in ref[2:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise KeyError(ref)
    return node
