"""The error a bad sampling parameter raises, and the type checks every parameter goes through."""

from __future__ import annotations

import math
from typing import Any

from tram.sampling_params.ranges import INT64_MAX, INT64_MIN, SEED_MAX, Range


class SamplingParamError(ValueError):
    """A sampling parameter is out of range or of the wrong type; `param` names it (the server's
    error body reports it as OpenAI's `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_range(name: str, value: float, allowed: Range) -> None:
    if not allowed.contains(value):
        raise SamplingParamError(name, f"{name} must be {allowed.describe()}, got {value}")


def is_int(value: Any) -> bool:
    # bool is an int subclass, but top_k=True is a bug, not a request.
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(name: str, value: Any, low: int = INT64_MIN, high: int = INT64_MAX) -> None:
    if not is_int(value):
        raise SamplingParamError(name, f"{name} must be an int, got {short(value)}")
    if not low <= value <= high:
        raise SamplingParamError(name, f"{name} must be in [{_bound(low)}, {_bound(high)}], got {short(value)}")


def _bound(value: int) -> str:
    names = {INT64_MAX: "2**63 - 1", INT64_MIN: "-2**63", SEED_MAX: "2**64 - 1"}
    return names.get(value, str(value))


def short(value: Any) -> str:
    """A value for an error message: a 10**30000 would otherwise make a 30 kB message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamError(name, f"{name} must be a number, got {short(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float
        raise SamplingParamError(name, f"{name} is out of range, got {short(value)}") from None
    if not math.isfinite(value):
        raise SamplingParamError(name, f"{name} must be finite, got {value!r}")
    return value


def token_id_list(name: str, ids: Any) -> list[int]:
    ids = [] if ids is None else ids
    if not isinstance(ids, (list, tuple, set, frozenset)):
        raise SamplingParamError(name, f"{name} must be a list of token ids, got {short(ids)}")
    for t in ids:
        if not is_int(t) or not 0 <= t <= INT64_MAX:
            raise SamplingParamError(name, f"{name} must contain token ids in [0, 2**63), got {short(t)}")
    return list(ids)


def parse_token_id(key: Any) -> int | None:
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key)
    if is_int(key) and 0 <= key <= INT64_MAX:
        return key
    return None
