"""Token counts of everything one caller submits to the engine, and the request log line.

The server's access log wants, per HTTP request, how many prompt and output tokens the engine
handled for it. Many routes submit work (completions, chat, /generate, beam search with its many
step-requests), all through `AsyncLLM.add_request`, so the count is kept there, in the
`UsageCounter` of the calling context (`track_usage`). asyncio tasks (and Starlette's streaming
tasks) copy the context they start in, so a request's streams and beam-search steps all count into
its counter, and concurrent HTTP requests never share one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tram.outputs import RequestOutput
from tram.sampling_params import SamplingParams

logger = logging.getLogger("tram.engine.requests")


@dataclass
class UsageCounter:
    """Engine requests submitted, their prompt tokens and the output tokens their consumers took."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0


_current: ContextVar[UsageCounter | None] = ContextVar("tram_usage", default=None)


@contextmanager
def track_usage() -> Iterator[UsageCounter]:
    """Count into a fresh counter every request submitted from this context while it is open."""
    counter = UsageCounter()
    token = _current.set(counter)
    try:
        yield counter
    finally:
        _current.reset(token)


def current_usage() -> UsageCounter | None:
    return _current.get()


class OutputTokenCount:
    """Adds one request's output tokens to a counter as its outputs are taken.

    DELTA outputs carry only the new tokens; cumulative and final ones carry the totals so far.
    """

    def __init__(self, counter: UsageCounter, delta: bool) -> None:
        self.counter = counter
        self.delta = delta
        self.seen = 0

    def add(self, output: RequestOutput) -> None:
        n = sum(len(c.token_ids) for c in output.outputs)
        total = self.seen + n if self.delta else n
        self.counter.output_tokens += total - self.seen
        self.seen = total


def log_request(
    request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams, max_log_len: int | None
) -> None:
    """vLLM's request log line; `max_log_len` cuts the prompt (characters) and its token ids."""
    if prompt is not None:
        prompt = prompt[:max_log_len]
    logger.info(
        "Received request %s: prompt: %r, params: %r, prompt_token_ids: %s",
        request_id,
        prompt,
        params,
        prompt_token_ids[:max_log_len],
    )
