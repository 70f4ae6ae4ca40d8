"""One step's flattened batch, computed from the persistent batch with vectorised numpy.

Every per-token and per-request input of a step lives in persistent buffers (`StepBuffers`): host
arrays written in place, and on CUDA device buffers refreshed with one copy each. The decode CUDA
graphs are captured over these same device buffers, so a replay needs no copies of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tram.core.sched_output import SchedulerOutput
from tram.model.attention.base import AttentionMetadata
from tram.worker.input_batch import InputBatch


class StepBuffers:
    """input_ids, positions, slot_mapping [max_tokens]; query_start_loc [max_reqs + 1]; seq_lens,
    logits_indices [max_reqs]. `np` holds numpy views of the host tensors, `dev` the device ones."""

    _SPECS = {
        "input_ids": (torch.int64, "tokens"),
        "positions": (torch.int64, "tokens"),
        "slot_mapping": (torch.int64, "tokens"),
        "query_start_loc": (torch.int32, "reqs+1"),
        "seq_lens": (torch.int32, "reqs"),
        "logits_indices": (torch.int64, "reqs"),
    }

    def __init__(self, max_tokens: int, max_reqs: int, device: torch.device, num_kv_cache_groups: int = 1) -> None:
        sizes = {"tokens": max_tokens, "reqs": max_reqs, "reqs+1": max_reqs + 1}
        pin = device.type == "cuda"
        self.device = device
        # Each further KV cache group has its own slot mapping (slot_mapping is group 0's).
        specs = {
            **self._SPECS,
            **{slot_mapping_name(g): self._SPECS["slot_mapping"] for g in range(1, num_kv_cache_groups)},
        }
        self.host = {k: torch.zeros(sizes[n], dtype=dt, pin_memory=pin) for k, (dt, n) in specs.items()}
        self.np = {k: t.numpy() for k, t in self.host.items()}
        self.dev = (
            self.host if device.type == "cpu" else {k: torch.zeros_like(t, device=device) for k, t in self.host.items()}
        )
        # Set once a step's host-to-device copies are queued: the next step must not rewrite the pinned
        # host buffers before the copies have read them (a step that samples nothing never syncs).
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def wait_for_copies(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()

    def copies_queued(self) -> None:
        if self._copied is not None:
            self._copied.record()

    def to_device(self, name: str, n: int) -> torch.Tensor:
        """The first n entries on the device (a view; one non-blocking copy on CUDA)."""
        dev = self.dev[name]
        if dev is not self.host[name]:
            dev[:n].copy_(self.host[name][:n], non_blocking=True)
        return dev[:n]


def slot_mapping_name(group: int) -> str:
    return "slot_mapping" if group == 0 else f"slot_mapping_{group}"


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
    logits_indices: torch.Tensor  # [B] the hidden row of each batch row's last scheduled token
    # [B] bool: the row's chunk reaches its last known token (and its drafts), so it samples
    sample_rows: np.ndarray
    prompt_logprobs_jobs: list[PromptLogprobsJob]
    token_rows: np.ndarray  # [T] each token's batch row (ascending)
    token_positions: np.ndarray  # [T] each token's position (a view of the buffer: valid for this step)
    chunk_ends: np.ndarray  # [B] each batch row's last hidden row (logits_indices on the host)


def prepare_inputs(
    batch: InputBatch,
    sched: SchedulerOutput,
    buffers: StepBuffers,
    block_size: int,
    num_drafts: np.ndarray | None = None,
) -> StepInputs:
    """Flatten the batch's rows (every row is scheduled this step) into one variable-length batch.
    num_drafts: per row, the draft tokens its chunk ends with (speculative decoding)."""
    buffers.wait_for_copies()
    num_reqs = batch.num_reqs
    req_ids = batch.req_ids
    q = np.fromiter((sched.num_scheduled_tokens[r] for r in req_ids), dtype=np.int64, count=num_reqs)
    start = batch.num_computed_tokens[:num_reqs]
    seq = start + q
    cu = np.cumsum(q)
    total = int(cu[-1])
    b = buffers.np
    rows = np.repeat(np.arange(num_reqs), q)
    # positions: each request's slice continues from its computed count
    positions = b["positions"][:total]
    np.subtract(np.arange(total), np.repeat(cu - q - start, q), out=positions)
    b["input_ids"][:total] = batch.token_ids[rows, positions]
    block_index, offset = positions // block_size, positions % block_size
    for g, table in enumerate(batch.block_table.groups):
        np.add(table.np[rows, block_index] * block_size, offset, out=b[slot_mapping_name(g)][:total])
    b["logits_indices"][:num_reqs] = cu - 1
    max_seq = int(seq.max())
    attended, q_attn, seq_attn = None, q, seq
    if num_drafts is not None:
        # A drafted row's last token and drafts are attended as one-token queries, each over its
        # request's block table (the chunk's K/V is written before any is read): verification runs
        # the decode kernels plain decoding runs, and gets their bits. Other rows keep their chunks.
        starts = np.zeros(total, dtype=bool)
        starts[cu - q] = True
        starts |= num_drafts[rows] > 0
        first = np.flatnonzero(starts)
        q_attn = np.empty_like(first)  # the gaps between starts (np.diff/np.append cost more)
        np.subtract(first[1:], first[:-1], out=q_attn[:-1])
        q_attn[-1] = total - first[-1]
        attended, seq_attn = rows[first], positions[first + q_attn - 1] + 1
    b["query_start_loc"][0] = 0
    b["query_start_loc"][1 : len(q_attn) + 1] = np.cumsum(q_attn)
    b["seq_lens"][: len(seq_attn)] = seq_attn
    metas = _group_metas(batch, buffers, total, q_attn, seq_attn, -(-max_seq // block_size), attended)
    meta = metas[0]
    if len(metas) > 1:
        meta.groups = tuple(metas)
    inputs = StepInputs(
        input_ids=buffers.to_device("input_ids", total),
        positions=buffers.to_device("positions", total),
        meta=meta,
        logits_indices=buffers.to_device("logits_indices", num_reqs),
        sample_rows=(seq if num_drafts is None else seq - num_drafts) == batch.num_tokens[:num_reqs],
        prompt_logprobs_jobs=_prompt_logprobs_jobs(batch, cu - q, q),
        token_rows=rows,
        token_positions=positions,
        chunk_ends=cu - 1,
    )
    buffers.copies_queued()
    return inputs


def _group_metas(
    batch: InputBatch,
    buffers: StepBuffers,
    total: int,
    q: np.ndarray,
    seq: np.ndarray,
    width: int,
    token_rows: np.ndarray | None = None,
) -> list[AttentionMetadata]:
    """One metadata per KV cache group: shared lengths, each group's block tables and slots. With
    token_rows, the attended rows are tokens, each reading its request's (batch row's) block table."""
    num_reqs = len(q)
    index = None if token_rows is None else torch.from_numpy(token_rows).to(batch.device)
    query_start_loc = buffers.to_device("query_start_loc", num_reqs + 1)
    seq_lens = buffers.to_device("seq_lens", num_reqs)
    q_list, seq_list = q.tolist(), seq.tolist()
    return [
        AttentionMetadata(
            num_tokens=total,
            slot_mapping=buffers.to_device(slot_mapping_name(g), total),
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=_tables(table.commit(batch.num_reqs), index, width),
            query_lens_list=q_list,
            seq_lens_list=seq_list,
            max_query_len=int(q.max()),
            max_seq_len=int(seq.max()),
        )
        for g, table in enumerate(batch.block_table.groups)
    ]


def _tables(tables: torch.Tensor, index: torch.Tensor | None, width: int) -> torch.Tensor:
    return tables[:, :width] if index is None else tables[index, :width]


def _prompt_logprobs_jobs(batch: InputBatch, offsets: np.ndarray, q: np.ndarray) -> list[PromptLogprobsJob]:
    """Position p predicts prompt token p+1, so the last prompt position has no prompt logprob.
    Each position is sent once: a prompt computed again (after a preemption) sends nothing twice."""
    jobs = []
    for row in batch.prompt_logprobs_rows():
        state = batch.states[row]
        assert state is not None
        start, n, offset = int(batch.num_computed_tokens[row]), int(q[row]), int(offsets[row])
        prompt = state.sampling.prompt_token_ids
        first, end = max(start, state.num_prompt_logprobs_sent), min(start + n, len(prompt) - 1)
        if end > first:
            jobs.append(
                PromptLogprobsJob(
                    state.req_id, np.arange(offset + first - start, offset + end - start), prompt[first + 1 : end + 1]
                )
            )
            state.num_prompt_logprobs_sent = end
    return jobs
