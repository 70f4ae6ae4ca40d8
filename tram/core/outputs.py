"""What the engine core reports each step, built by the scheduler: the new tokens and finish of each
sequence (EngineCoreOutput), the scheduler's stats, and the requests that failed.

These cross to the API server, so they are msgspec structs like every message there; they live here,
beside the scheduler that builds them, because core sits below engine (core never imports engine).
tram/engine/messages.py re-exports them: that module stays the one place the API process reads the
whole engine <-> API boundary from.
"""

from __future__ import annotations

import msgspec

from tram.core.sched_output import LogprobsLists

_STRUCT = dict(array_like=True, omit_defaults=True, gc=False)


class EngineCoreOutput(msgspec.Struct, **_STRUCT):
    """What one step produced for one sequence: only the new tokens, never the history."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None  # seconds from arrival to first scheduled; on the first token only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SpecDecodingCounts(msgspec.Struct, **_STRUCT):
    """Speculative decoding's running totals (core/spec_stats.py)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = []

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens each verification produced on average: the accepted drafts plus the one sampled."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class SchedulerStats(msgspec.Struct, **_STRUCT):
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # cumulative, in tokens
    prefix_cache_hits: int = 0  # cumulative, in tokens
    num_preemptions: int = 0  # cumulative
    num_scheduled_tokens: int = 0  # this step
    # Structured outputs: running totals, and the compile times since the last report.
    structured_output_requests: int = 0
    grammar_compile_failures: int = 0
    grammar_cache_hits: int = 0
    grammar_compile_seconds: list[float] = []
    spec_decoding: SpecDecodingCounts | None = None  # running totals; None without speculation


class RequestError(msgspec.Struct, **_STRUCT):
    request_id: str
    message: str
    param: str | None = None  # the request field at fault, when it is the client's
    client_error: bool = False  # the request was bad (a 400), not the engine (a 500)


class EngineCoreOutputs(msgspec.Struct, **_STRUCT):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    request_errors: list[RequestError] = []  # requests that ended in this step because they were bad
