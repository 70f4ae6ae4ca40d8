"""Messages between the worker, the core and the engine front end.

They are msgspec structs so the server can send them between processes unchanged: token ids and
floats as plain lists, never tensors.
"""
from __future__ import annotations

import msgspec


class LogprobsLists(msgspec.Struct, array_like=True, omit_defaults=True):
    """Per position: column 0 is the chosen token, the rest the top-k in descending order."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]  # 1-based rank of the chosen token in the whole vocabulary


class ModelRunnerOutput(msgspec.Struct):
    """What one step of the worker produced, keyed by request id."""

    sampled_token_ids: dict[str, int] = {}
    logprobs: dict[str, LogprobsLists] = {}
    # Prompt logprobs of this step's prompt positions (the token at position p+1 given 0..p).
    prompt_logprobs: dict[str, LogprobsLists] = {}


class SchedulerStats(msgspec.Struct):
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # cumulative, in tokens
    prefix_cache_hits: int = 0  # cumulative, in tokens
    num_preemptions: int = 0  # cumulative
    num_scheduled_tokens: int = 0  # this step


class EngineCoreOutput(msgspec.Struct, omit_defaults=True):
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


class EngineCoreOutputs(msgspec.Struct):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
