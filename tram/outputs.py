"""Public output types, shaped like vLLM's so user code reads them unchanged."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the top-k tokens plus the chosen one).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generation_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
