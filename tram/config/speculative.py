"""Speculative decoding's settings, in vLLM's shape: `--speculative-config '{"method": "ngram",
"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'` on the command line,
the same dict as `LLM(speculative_config=...)`.

The methods are the proposers the spec_decode package registers (SPECULATIVE_METHODS); this module
only checks the numbers, so that every refusal is one line at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from tram.config.registry import SPECULATIVE_METHODS

MAX_SPECULATIVE_TOKENS = 16
# vLLM's n-gram window when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens a proposer drafts per step and how it finds them.

    disable_by_batch_size: with this many requests running or more, a step drafts nothing: a large
    batch's verification costs more than the tokens it saves (vLLM's setting of the same name).
    None: the proposer's own default (spec_decode decides it from the step's shape).

    model: the draft model's checkpoint (draft_model), which the engine reads at start into
    draft_model_config (a ModelConfig: same dtype, device and context length as the target's).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    disable_by_batch_size: int | None = None
    model: str | None = None
    draft_model_config: Any = field(default=None, repr=False, compare=False)


_KEYS = {f.name for f in fields(SpeculativeConfig)} - {"draft_model_config"}


def parse_speculative_config(value: dict[str, Any] | str | SpeculativeConfig | None) -> SpeculativeConfig | None:
    """The settings from a dict or its JSON text; ValueError naming what is wrong."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative_config is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    method = value.get("method")
    if not isinstance(method, str):
        raise ValueError(f"speculative_config needs a method; one of: {', '.join(SPECULATIVE_METHODS.names())}")
    if method not in SPECULATIVE_METHODS.names():
        raise SPECULATIVE_METHODS.unknown(f"speculative_config method {method!r}")
    k = _int(value, "num_speculative_tokens", None)
    if k is None or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_config num_speculative_tokens must be 1..{MAX_SPECULATIVE_TOKENS}, got {k}")
    low, high = _int(value, "prompt_lookup_min", None), _int(value, "prompt_lookup_max", None)
    low, high = low or high or DEFAULT_PROMPT_LOOKUP, high or low or DEFAULT_PROMPT_LOOKUP
    if not 1 <= low <= high:
        raise ValueError(f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {low} and {high}")
    disable = _int(value, "disable_by_batch_size", None)
    if disable is not None and disable < 1:
        raise ValueError(f"speculative_config disable_by_batch_size must be positive, got {disable}")
    model = value.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"speculative_config model must be a path or a Hugging Face name, got {model!r}")
    return SpeculativeConfig(method, k, low, high, disable, model)


def _int(value: dict[str, Any], key: str, default: int | None) -> int | None:
    got = value.get(key, default)
    if got is None:
        return None
    if isinstance(got, bool) or not isinstance(got, int):
        raise ValueError(f"speculative_config {key} must be an integer, got {got!r}")
    return got
