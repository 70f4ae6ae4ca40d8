"""A repr for log lines whose cost does not grow with the value: request logs print each request's
sampling parameters, and a JSON schema of hundreds of KB formatted whole, then cut, took ~20-30 ms
of the API server's event loop per request (issue 35).
"""

from __future__ import annotations

import itertools
from typing import Any

MAX_ITEMS = 8  # entries shown of one dict or list


class _Text(str):
    """Text to emit as it is (not a value to format)."""


def short_repr(value: Any, limit: int) -> str:
    """`repr(value)` up to about `limit` characters, then "...": dicts and lists are walked from the
    front (at most MAX_ITEMS entries each, iteratively, so depth costs nothing), strings are cut before
    they are quoted, and nothing is formatted past the limit."""
    parts: list[str] = []
    size = 0
    stack: list[Any] = [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, _Text):
            text = str(item)
        elif isinstance(item, dict):
            text = "{"
            _push_entries(stack, list(itertools.islice(item.items(), MAX_ITEMS)), len(item), "}", True)
        elif isinstance(item, (list, tuple)):
            text = "["
            _push_entries(stack, list(itertools.islice(item, MAX_ITEMS)), len(item), "]", False)
        elif isinstance(item, str):
            text = repr(item[:limit]) + (f"... ({len(item)} characters)" if len(item) > limit else "")
        else:
            text = repr(item)[:limit]
        parts.append(text)
        size += len(text)
    out = "".join(parts)
    return out if not stack and len(out) <= limit else out[:limit] + "..."


def _push_entries(stack: list[Any], entries: list[Any], total: int, close: str, pairs: bool) -> None:
    """Push a container's shown entries so that they pop in order, then its closing bracket."""
    stack.append(_Text(close if total <= len(entries) else ", ..." + close))
    for i in range(len(entries) - 1, -1, -1):
        if pairs:
            key, item = entries[i]
            stack.append(item)
            stack.append(_Text(": "))
            stack.append(key)
        else:
            stack.append(entries[i])
        if i:
            stack.append(_Text(", "))
