"""Public output types, shaped like vLLM's so user code reads them unchanged."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One dict per position: token id -> Logprob (the top-k tokens plus the chosen one).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


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


def merge_deltas(outputs: list[RequestOutput]) -> RequestOutput:
    """One DELTA output equal to several consecutive ones of the same request (what vLLM's
    `RequestOutput.add(..., aggregate=True)` builds), in time linear in their total size: a consumer
    that fell behind gets everything it missed at once, and nothing is dropped."""
    if len(outputs) == 1:
        return outputs[0]
    merged: dict[int, CompletionOutput] = {}
    texts: dict[int, list[str]] = {}
    for out in outputs:
        for c in out.outputs:
            into = merged.get(c.index)
            if into is None:
                merged[c.index] = replace(
                    c, token_ids=list(c.token_ids), logprobs=None if c.logprobs is None else list(c.logprobs)
                )
                texts[c.index] = [c.text]
                continue
            texts[c.index].append(c.text)
            into.token_ids.extend(c.token_ids)
            if c.logprobs is not None:
                if into.logprobs is None:
                    into.logprobs = []
                into.logprobs.extend(c.logprobs)
            into.cumulative_logprob = c.cumulative_logprob
            into.finish_reason, into.stop_reason = c.finish_reason, c.stop_reason
    for index, parts in texts.items():
        merged[index].text = "".join(parts)
    first, last = outputs[0], outputs[-1]
    # Prompt logprobs come once, with the first output that has them.
    prompt_logprobs = next((o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None), None)
    return RequestOutput(
        first.request_id,
        first.prompt,
        first.prompt_token_ids,
        [merged[i] for i in sorted(merged)],
        any(o.finished for o in outputs),
        prompt_logprobs,
        last.num_cached_tokens,
        last.metrics,
    )
