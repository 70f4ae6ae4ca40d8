"""The messages between the engine core and its workers: what to compute this step (the scheduler
output) and what came of it (the model runner output, with its logprobs rows).

New requests travel in full once; running ones as small diffs (new block ids, computed count). The
worker keeps per-request state across steps, drops it when a request id shows up in
`finished_req_ids`, and takes out of its batch every request that is not scheduled in a step. They
are msgspec structs so they can cross to worker processes unchanged: token ids as plain lists.
"""

from __future__ import annotations

import msgspec

from tram.sampling_params import SamplingParams

_STRUCT = dict(array_like=True, omit_defaults=True, gc=False)


class NewRequestData(msgspec.Struct, **_STRUCT):
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[list[int]]  # per KV cache group, in position order
    num_computed_tokens: int
    # Masked by the sampler while the request has fewer than min_tokens outputs: its stop_token_ids
    # and every eos id (even with ignore_eos, as vLLM does).
    min_tokens_masked_ids: frozenset[int] = frozenset()


class CachedRequestData(msgspec.Struct, **_STRUCT):
    req_id: str
    new_block_ids: list[list[int]]  # per KV cache group
    num_computed_tokens: int
    # After a preemption the request holds a fresh block list: `new_block_ids` replaces the old one.
    resumed_from_preemption: bool = False
    # Pipeline parallelism only: output tokens sampled since this request was last sent, for the
    # stages that do not sample (the first stage embeds them as the next step's inputs).
    new_token_ids: list[int] = []


class GrammarBitmask(msgspec.Struct, **_STRUCT):
    """The step's token bitmask for constrained requests: row i (int32 words, bit j of word w allows
    token 32*w + j) belongs to req_ids[i]. Raw bytes, so it crosses a process boundary as one frame.
    With speculative decoding a request that verifies drafts has a row per draft position and one
    for the position after its last draft: `num_rows` per request (empty: one row each)."""

    req_ids: list[str]
    words: int
    data: bytes
    num_rows: list[int] = []


class SchedulerOutput(msgspec.Struct, **_STRUCT):
    scheduled_new_reqs: list[NewRequestData] = []
    scheduled_cached_reqs: list[CachedRequestData] = []
    num_scheduled_tokens: dict[str, int] = {}
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = set()
    grammar_bitmask: GrammarBitmask | None = None
    # Speculative decoding: the draft tokens each listed request verifies this step, after its last
    # known token (counted in num_scheduled_tokens: 1 + len(drafts)).
    scheduled_spec_decode_tokens: dict[str, list[int]] = {}

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


class LogprobsLists(msgspec.Struct, **_STRUCT):
    """Per position: column 0 is the chosen token, the rest the top-k in descending order. The worker
    makes them and the engine core passes them on unchanged to the API server (in EngineCoreOutput)."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]  # 1-based rank of the chosen token in the whole vocabulary


class ModelRunnerOutput(msgspec.Struct, **_STRUCT):
    """What one step of the worker produced, keyed by request id. A request that verified drafts
    gets its accepted drafts and one token more; any other one token."""

    sampled_token_ids: dict[str, list[int]] = {}
    logprobs: dict[str, LogprobsLists] = {}  # a row per sampled token
    # Prompt logprobs of this step's prompt positions (the token at position p+1 given 0..p).
    prompt_logprobs: dict[str, LogprobsLists] = {}
    # Speculative decoding: the proposer's drafts for each request's next step.
    spec_token_ids: dict[str, list[int]] = {}
