"""What the scheduler tells the worker each step: the only thing the worker sees.

New requests travel in full once; running ones as small diffs (new block ids, computed count).
The worker keeps per-request state across steps and drops it when a request id shows up in
`finished_req_ids`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tram.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    # Ids the sampler masks while the request is below min_tokens (stop ids and every eos id).
    stop_token_ids: frozenset[int] = frozenset()


@dataclass
class CachedRequestData:
    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    # After a preemption the request holds a fresh block list: `new_block_ids` replaces the old one.
    resumed_from_preemption: bool = False


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    # Batch order is this dict's insertion order.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
