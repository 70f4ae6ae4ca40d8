"""Sampling parameters of one request, with vLLM's names, defaults and validation."""
from __future__ import annotations

import copy
import math
from enum import IntEnum
from typing import Any

import msgspec

# Below this temperature a request is greedy; dividing logits by it would only add noise.
SAMPLING_EPS = 1e-5
# torch.Generator.manual_seed accepts exactly this range; reject the rest here, not in the worker.
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(IntEnum):
    """What each `RequestOutput` of a request holds (vLLM's names and values)."""

    CUMULATIVE = 0  # everything so far, every step: each output costs O(length generated)
    DELTA = 1  # only what is new since the request's previous output: O(new) per step
    FINAL_ONLY = 2  # one output, when the request finishes


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick the output tokens of one request (names and defaults follow vLLM).

    A msgspec Struct so that it crosses the engine's process boundary as a few msgpack bytes;
    `__post_init__` validates and normalises on construction and again on decode.

    Normalisations: `stop` and `stop_token_ids` become lists, `top_k=-1` becomes 0 (both mean
    "disabled"), `logit_bias` keys become ints, and greedy requests (temperature < 1e-5) get
    top_p=1, top_k=0, min_p=0 since those filters cannot change an argmax. This is the only place
    that normalises and validates stop strings and logit_bias keys: the server's request models
    pass them through as the client sent them, and the detokenizer takes them as given.

    `output_kind` says what each output of the request holds (see `RequestOutputKind`); the offline
    `LLM` asks for FINAL_ONLY, the server streams DELTA.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    # Defaults are the normalised form ([]), so omit_defaults drops them from the wire.
    stop: str | list[str] | None = []
    stop_token_ids: list[int] | None = []
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        self._normalise_numbers()
        self._normalise_output_kind()
        self._normalise_stops()
        self._normalise_logit_bias()
        self._verify_ranges()
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    # ----------------------------------------------------------------- validation helpers

    def _normalise_numbers(self) -> None:
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p", "min_p"):
            setattr(self, name, _as_float(name, getattr(self, name)))
        for name in ("n", "top_k", "min_tokens"):
            _require_int(name, getattr(self, name))
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name))
        if self.top_k == -1:
            self.top_k = 0

    def _normalise_output_kind(self) -> None:
        kind = self.output_kind
        if not isinstance(kind, RequestOutputKind):
            if not _is_int(kind) or kind not in set(RequestOutputKind):
                raise ValueError(f"output_kind must be a RequestOutputKind, got {kind!r}")
            self.output_kind = RequestOutputKind(kind)

    def _normalise_stops(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        for s in self.stop:
            if not isinstance(s, str):
                raise ValueError(f"stop must contain only strings, got {s!r}")
            if not s:
                raise ValueError("stop cannot contain an empty string")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")

        ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(ids, (list, tuple, set, frozenset)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {ids!r}")
        for t in ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids must contain non-negative ints, got {t!r}")
        self.stop_token_ids = list(ids)

    def _normalise_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
        bias: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            # JSON objects only have string keys, so OpenAI clients send {"50256": -100}.
            token_id = _parse_token_id(key)
            if token_id is None:
                raise ValueError(f"logit_bias keys must be non-negative token ids, got {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"logit_bias values must be numbers, got {value!r} for token {key!r}")
            value = float(value)
            # +inf or NaN would turn the whole row of probabilities into NaN.
            if math.isnan(value) or value == math.inf:
                raise ValueError(f"logit_bias values must be finite or -inf, got {value} for token {key!r}")
            bias[token_id] = value
        self.logit_bias = bias

    def _verify_ranges(self) -> None:
        # Written as `not (in range)` so that NaN fails every check.
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        if not self.temperature >= 0.0 or math.isinf(self.temperature):
            raise ValueError(f"temperature must be non-negative and finite, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not _SEED_MIN <= self.seed <= _SEED_MAX:
            raise ValueError(f"seed must be in [-2**63, 2**64 - 1], got {self.seed}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to "
                             f"max_tokens={self.max_tokens}, got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < -1:
                raise ValueError(f"{name} must be non-negative or -1 (whole vocabulary), got {value}")

    # ----------------------------------------------------------------------- public helpers

    def clone(self) -> SamplingParams:
        """A deep copy, so that per-request edits (eos ids) never leak into a shared template."""
        return copy.deepcopy(self)

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        if self.seed is not None:
            return SamplingType.RANDOM_SEED
        return SamplingType.RANDOM

    def verify_token_ids(self, vocab_size: int) -> None:
        """Reject token ids the model cannot produce; the engine calls this on add_request."""
        for t in self.logit_bias or ():
            if t >= vocab_size:
                raise ValueError(f"logit_bias token id {t} is out of vocabulary (size {vocab_size})")
        for t in self.stop_token_ids or ():
            if t >= vocab_size:
                raise ValueError(f"stop_token_ids token id {t} is out of vocabulary (size {vocab_size})")


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but top_k=True is a bug, not a request.
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(name: str, value: Any) -> None:
    if not _is_int(value):
        raise ValueError(f"{name} must be an int, got {value!r}")


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _parse_token_id(key: Any) -> int | None:
    if _is_int(key):
        return key if key >= 0 else None
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return None
