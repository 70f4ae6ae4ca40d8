"""Sampling parameters of one request, with vLLM's names, defaults and validation (the ranges
themselves: ranges.py)."""

from __future__ import annotations

import copy
import math
from enum import IntEnum

import msgspec

from tram.sampling_params.checks import (
    SamplingParamError,
    as_float,
    check_range,
    is_int,
    parse_token_id,
    require_int,
    short,
    token_id_list,
)
from tram.sampling_params.ranges import INT64_MIN, SAMPLING_RANGES, SEED_MAX
from tram.sampling_params.structured import StructuredOutputsParams

# Below this temperature a request is greedy; dividing logits by it would only add noise.
SAMPLING_EPS = 1e-5


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
    # Only these token ids may be sampled (vLLM's field); None allows the whole vocabulary.
    allowed_token_ids: list[int] | None = None
    # Keep only the last k prompt tokens (vLLM's left truncation); None keeps them all.
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # JSON schema, regex, choice or grammar the output must match (tram/structured_output/).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        self._normalise_numbers()
        self._normalise_output_kind()
        self._normalise_stops()
        self._normalise_logit_bias()
        self._normalise_allowed_token_ids()
        self._normalise_structured_outputs()
        self._verify_ranges()
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    # ----------------------------------------------------------------- validation helpers

    def _normalise_numbers(self) -> None:
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "min_p"):
            setattr(self, name, as_float(name, getattr(self, name)))
        # Every other integer crosses to the engine core as a signed 64-bit msgpack int: a larger one
        # must be a client error here, not a serialisation failure after the request was registered.
        for name in ("n", "top_k", "min_tokens"):
            require_int(name, getattr(self, name))
        for name in ("max_tokens", "logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name))
        if self.seed is not None:  # the seed's own range: reject the rest here, not in the worker
            require_int("seed", self.seed, INT64_MIN, SEED_MAX)
        if self.top_k == -1:
            self.top_k = 0

    def _normalise_output_kind(self) -> None:
        kind = self.output_kind
        if not isinstance(kind, RequestOutputKind):
            if not is_int(kind) or kind not in set(RequestOutputKind):
                raise SamplingParamError("output_kind", f"output_kind must be a RequestOutputKind, got {kind!r}")
            self.output_kind = RequestOutputKind(kind)

    def _normalise_stops(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        else:
            raise SamplingParamError("stop", f"stop must be a string or a list of strings, got {self.stop!r}")
        for s in self.stop:
            if not isinstance(s, str):
                raise SamplingParamError("stop", f"stop must contain only strings, got {s!r}")
            if not s:
                raise SamplingParamError("stop", "stop cannot contain an empty string")
        if self.stop and not self.detokenize:
            raise SamplingParamError("stop", "stop strings need detokenize=True")
        self.stop_token_ids = token_id_list("stop_token_ids", self.stop_token_ids)

    def _normalise_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise SamplingParamError(
                "logit_bias", f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}"
            )
        bias: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            # JSON objects only have string keys, so OpenAI clients send {"50256": -100}.
            token_id = parse_token_id(key)
            if token_id is None:
                raise SamplingParamError("logit_bias", f"logit_bias keys must be token ids in [0, 2**63), got {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SamplingParamError(
                    "logit_bias", f"logit_bias values must be numbers, got {short(value)} for token {key!r}"
                )
            value = float(value)
            # +inf or NaN would turn the whole row of probabilities into NaN.
            if math.isnan(value) or value == math.inf:
                raise SamplingParamError(
                    "logit_bias", f"logit_bias values must be finite or -inf, got {value} for token {key!r}"
                )
            bias[token_id] = value
        self.logit_bias = bias

    def _normalise_allowed_token_ids(self) -> None:
        if self.allowed_token_ids is None:
            return
        self.allowed_token_ids = token_id_list("allowed_token_ids", self.allowed_token_ids)
        if not self.allowed_token_ids:
            raise SamplingParamError("allowed_token_ids", "allowed_token_ids must not be empty")

    def _normalise_structured_outputs(self) -> None:
        so = self.structured_outputs
        if isinstance(so, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**so)
            except TypeError as e:
                raise SamplingParamError("structured_outputs", f"structured_outputs: {e}") from e
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise SamplingParamError(
                "structured_outputs", f"structured_outputs must be a StructuredOutputsParams, got {short(so)}"
            )

    def _verify_ranges(self) -> None:
        for name, allowed in SAMPLING_RANGES.items():
            value = getattr(self, name)
            if value is not None:  # the optional counts (max_tokens, logprobs, ...) may be unset
                check_range(name, value, allowed)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamError(
                "min_tokens",
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}",
            )

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
        for name in ("logit_bias", "stop_token_ids", "allowed_token_ids"):
            for t in getattr(self, name) or ():
                if t >= vocab_size:
                    raise SamplingParamError(name, f"{name} token id {t} is out of vocabulary (size {vocab_size})")
