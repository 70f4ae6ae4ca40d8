"""The allowed range of each numeric sampling parameter, stated once.

`SamplingParams` checks values against these, and its error messages state the range in the words
here; the server's request models take their pydantic bounds from them (`Range.bounds()`), so the
OpenAPI document, the 400s raised while parsing and the engine's own check cannot drift apart. An
API moves a bound only where its own documentation does: OpenAI caps n at 128, and completions'
max_tokens may be 0 (echo the prompt, generate nothing), which never reaches SamplingParams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Every integer crosses to the engine core as a signed 64-bit msgpack int (and lands in int64 tensors).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# torch.Generator.manual_seed accepts exactly [-2**63, 2**64).
SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class Range:
    """Values from `low` (excluded when `low_open`) to `high`, both inclusive otherwise; None is
    unbounded. Float ranges hold finite values only. `says` is how an error message states the
    range when the bounds alone do not say it ("0 or -1 (disabled) or at least 1")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False
    says: str = ""

    def contains(self, value: float) -> bool:
        # Each test is written as "inside", so that NaN fails every one of them.
        if not self.integer and not math.isfinite(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        """The range in words, for "x must be ...": "in [0, 1]", "in (0, 1]", "at least 1"."""
        if self.says:
            return self.says
        if self.high is None or (self.integer and self.high == INT64_MAX):
            return f"at least {_num(self.low)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}]"

    def bounds(self, *, low: float | None = None, high: float | None = None) -> dict[str, Any]:
        """pydantic `Field` keywords for this range; `low` / `high` replace a bound for one API. Where
        there is no upper bound, a float field is told to refuse inf and NaN, which no bound keeps out."""
        low = self.low if low is None else low
        high = self.high if high is None else high
        out: dict[str, Any] = {}
        if low is not None:
            out["gt" if self.low_open else "ge"] = low
        if high is not None:
            out["le"] = high
        elif not self.integer:
            out["allow_inf_nan"] = False
        return out


def _num(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _int_range(low: int, says: str = "", high: int = INT64_MAX) -> Range:
    return Range(low, high, integer=True, says=says)


TOKEN_ID = _int_range(0)
SEED = _int_range(INT64_MIN, high=SEED_MAX)

# SamplingParams' numeric fields, in the order it checks them.
SAMPLING_RANGES: dict[str, Range] = {
    "n": _int_range(1),
    "presence_penalty": Range(-2.0, 2.0),
    "frequency_penalty": Range(-2.0, 2.0),
    "repetition_penalty": Range(0.0, low_open=True, says="greater than zero"),
    "temperature": Range(0.0, says="non-negative and finite"),
    "top_p": Range(0.0, 1.0, low_open=True),
    "top_k": _int_range(-1, "0 or -1 (disabled) or at least 1"),
    "min_p": Range(0.0, 1.0),
    "max_tokens": _int_range(1),
    "min_tokens": _int_range(0, "greater than or equal to 0"),
    "truncate_prompt_tokens": _int_range(1),
    "logprobs": _int_range(-1, "non-negative or -1 (whole vocabulary)"),
    "prompt_logprobs": _int_range(-1, "non-negative or -1 (whole vocabulary)"),
}
