"""Per-request state the worker keeps across steps, and the flattened batch built from it each step."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tram.core.sched_output import SchedulerOutput
from tram.model.attention.base import AttentionMetadata
from tram.sampling_params import SamplingParams
from tram.worker.device_copy import to_device


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    stop_token_ids: frozenset[int]
    generator: torch.Generator | None
    output_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # prompt + output

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)


@dataclass
class PromptLogprobsJob:
    """Prompt positions of this step whose next-token logprobs a request asked for."""

    req_id: str
    hidden_indices: np.ndarray  # rows of the step's hidden states
    target_token_ids: list[int]  # the prompt token that follows each of those positions


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_req_ids: list[str]  # requests whose chunk ends at their last known token
    sample_indices: torch.Tensor  # [S] rows of the hidden states to sample from
    prompt_logprobs_jobs: list[PromptLogprobsJob]


def prepare_inputs(
    states: dict[str, CachedRequestState], sched: SchedulerOutput, block_size: int, device: torch.device
) -> StepInputs:
    """Flatten the scheduled requests (in the scheduler's order) into one variable-length batch."""
    req_ids = list(sched.num_scheduled_tokens)
    query_lens = [sched.num_scheduled_tokens[r] for r in req_ids]
    input_ids: list[int] = []
    starts: list[int] = []
    sample_req_ids: list[str] = []
    sample_indices: list[int] = []
    jobs: list[PromptLogprobsJob] = []
    offset = 0
    for rid, n in zip(req_ids, query_lens):
        st = states[rid]
        start = st.num_computed_tokens
        starts.append(start)
        input_ids.extend(st.token_ids[start : start + n])
        if start + n == len(st.token_ids):
            sample_req_ids.append(rid)
            sample_indices.append(offset + n - 1)
        if st.sampling_params.prompt_logprobs is not None:
            job = _prompt_logprobs_job(st, start, n, offset)
            if job is not None:
                jobs.append(job)
        offset += n
    q_lens = np.asarray(query_lens, dtype=np.int64)
    seq_lens = np.asarray(starts, dtype=np.int64) + q_lens
    # positions: each request's slice continues from its computed count
    positions = np.arange(offset, dtype=np.int64) - np.repeat(np.cumsum(q_lens) - q_lens - starts, q_lens)
    max_blocks = int(-(-seq_lens.max() // block_size))
    block_table = np.zeros((len(req_ids), max_blocks), dtype=np.int64)
    for i, rid in enumerate(req_ids):
        ids = states[rid].block_ids[:max_blocks]
        block_table[i, : len(ids)] = ids
    row = np.repeat(np.arange(len(req_ids)), q_lens)
    slot_mapping = block_table[row, positions // block_size] * block_size + positions % block_size
    query_start_loc = np.concatenate(([0], np.cumsum(q_lens)))
    meta = AttentionMetadata(
        num_tokens=offset,
        slot_mapping=to_device(slot_mapping, torch.long, device),
        query_start_loc=to_device(query_start_loc, torch.int32, device),
        seq_lens=to_device(seq_lens, torch.int32, device),
        block_tables=to_device(block_table, torch.int32, device),
        query_lens_list=query_lens,
        seq_lens_list=seq_lens.tolist(),
        max_query_len=int(q_lens.max()),
        max_seq_len=int(seq_lens.max()),
    )
    return StepInputs(
        input_ids=to_device(input_ids, torch.long, device),
        positions=to_device(positions, torch.long, device),
        meta=meta,
        sample_req_ids=sample_req_ids,
        sample_indices=to_device(sample_indices, torch.long, device),
        prompt_logprobs_jobs=jobs,
    )


def _prompt_logprobs_job(st: CachedRequestState, start: int, n: int, offset: int) -> PromptLogprobsJob | None:
    """Position p predicts prompt token p+1, so the last prompt position has no prompt logprob."""
    end = min(start + n, len(st.prompt_token_ids) - 1)
    if end <= start:
        return None
    return PromptLogprobsJob(
        st.req_id,
        np.arange(offset, offset + end - start),
        st.prompt_token_ids[start + 1 : end + 1],
    )
