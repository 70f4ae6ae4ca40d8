"""One walk over a client's parsed JSON value for everything the readers after it cannot take.

A schema crosses to the engine core as msgpack (64-bit integers only, UTF-8 only) and goes on to a
grammar engine's converter (recursive, UTF-8 only). Three separate walks (depth, integers, lone
surrogates) cost ~40 ms of the API's event loop for a 450 KB schema, during which no other client is
served; one walk finds the first of the three faults for the price of one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tram.sampling_params.client_json import MAX_JSON_DEPTH

PATH_CHARS = 120
Members = Callable[[Any], Iterable[tuple[Any, Any]]]


def json_members(item: Any) -> Iterable[tuple[Any, Any]]:
    """(key, value) of a JSON object's or array's members; nothing for a scalar."""
    if isinstance(item, dict):
        return item.items()
    if isinstance(item, list):
        return enumerate(item)
    return ()


def surrogate_index(text: str) -> int | None:
    """Where the first lone surrogate in `text` is, or None."""
    if text.isascii():  # O(1): most text never needs the encode below
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _path(parents: list[tuple[int, str]], node: int) -> str:
    keys = []
    while node >= 0:
        node, key = parents[node]
        keys.append(key)
    path = ".".join(reversed(keys))
    return path if len(path) <= PATH_CHARS else path[: PATH_CHARS - 3] + "..."


def _surrogate(char: str, index: int | None, parents: list[tuple[int, str]], node: int) -> str:
    what = f"U+{ord(char):04X} at index {index}" if index is not None else f"U+{ord(char):04X} in a key"
    where = what + (f" of '{_path(parents, node)}'" if node >= 0 else "")
    return f"it contains a lone surrogate ({where}); text must be valid Unicode"


def _huge(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and not -(2**63) <= item < 2**64


def _fault_kind(value: Any, members: Members, limit: int) -> str | None:
    """ "deep", "huge" or "surrogate" for the first fault found; None. The hot path: it keeps no
    parents (100,000 tuples for a 450 KB schema, and the collections they set off)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        pairs = item.items() if type(item) is dict else enumerate(item) if type(item) is list else members(item)
        for key, child in pairs:
            if type(key) is str and not key.isascii() and surrogate_index(key) is not None:
                return "surrogate"
            kind = type(child)
            if kind is str:
                if not child.isascii() and surrogate_index(child) is not None:
                    return "surrogate"
            elif kind is int or kind is float or kind is bool or child is None:
                if kind is int and not -(2**63) <= child < 2**64:
                    return "huge"
            else:
                if depth >= limit:
                    return "deep"
                pending.append((child, depth + 1))
    return None


def _where_surrogate(value: Any, members: Members) -> str:
    """The first lone surrogate's description, with its path: walked again, keeping parents, only
    once one is known to be there."""
    parents: list[tuple[int, str]] = []  # node -> (its parent node, its key)
    pending: list[tuple[int, Any]] = [(-1, value)]
    while pending:
        node, item = pending.pop()
        for key, child in members(item):
            if isinstance(key, str) and (index := surrogate_index(key)) is not None:
                return _surrogate(key[index], None, parents, node)
            if isinstance(child, str):
                if (index := surrogate_index(child)) is not None:
                    parents.append((node, str(key)))
                    return _surrogate(child[index], index, parents, len(parents) - 1)
            elif not isinstance(child, (int, float, bool)) and child is not None:
                parents.append((node, str(key)))
                pending.append((len(parents) - 1, child))
    raise AssertionError("no lone surrogate")  # _fault_kind found one: unreachable


def json_fault(value: Any, members: Members = json_members, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The first fault in `value`, as the end of a sentence that names the field ("it is nested more
    than 256 levels deep", "it holds an integer beyond 64 bits", "it contains a lone surrogate
    (U+D800 at index 3 of 'properties.name.pattern'); ..."); None if it has none. Iterative, so any
    depth costs no stack.

    `members` lists a container's (key, value) pairs: a caller whose values hold request models as
    well as JSON passes one that opens those too (JSON objects and arrays are opened directly)."""
    if isinstance(value, str):
        index = surrogate_index(value)
        return None if index is None else _surrogate(value[index], index, [], -1)
    if _huge(value):
        return "it holds an integer beyond 64 bits"
    kind = _fault_kind(value, members, limit)
    if kind == "deep":
        return f"it is nested more than {limit} levels deep"
    if kind == "huge":
        return "it holds an integer beyond 64 bits"
    return None if kind is None else _where_surrogate(value, members)
