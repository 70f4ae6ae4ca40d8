"""JSON that clients send as text or as nested values, held to one depth limit.

Python's json, msgpack, Jinja's `tojson` and the grammar engines' schema converters all recurse
once per level of nesting: a schema text nested ~1,000 deep raised RecursionError out of
`json.loads`, a 500. Every place that parses a client's text as JSON goes through `loads_bounded`,
and every nested value that goes on to one of those recursive readers through `too_deep`, so the
limit is stated once and each caller names its own field in the 400.
"""

from __future__ import annotations

import json
from typing import Any

# Far beyond any real schema or arguments object (pydantic's nest a model per $defs entry, a few
# levels each), and far enough below the interpreter's recursion limit (1,000 frames) that every
# recursive reader downstream has room for its own frames.
MAX_JSON_DEPTH = 256


class JSONTooDeepError(ValueError):
    """Nested deeper than MAX_JSON_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"it is nested more than {MAX_JSON_DEPTH} levels deep")


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests objects and arrays more than `limit` deep. Iterative, so
    any depth is measured without exhausting the stack."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def loads_bounded(text: str) -> Any:
    """`json.loads`, but JSONTooDeepError (a ValueError) for nesting beyond MAX_JSON_DEPTH, whether
    json's own recursion gave out first or not; ValueError for text that is not JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeepError() from None
    if too_deep(value):
        raise JSONTooDeepError()
    return value
