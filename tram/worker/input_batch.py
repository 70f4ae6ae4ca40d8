"""The worker's per-request state and the persistent batch built from it.

`CachedRequestState` lives as long as the request (preemption included). `InputBatch` holds one row
per request scheduled in the current step, in numpy columns that steps update in place: token ids
(prompt + outputs), counts, and the block table. The model runner applies the scheduler's diff to
it: new requests are added in full, running ones get their new block ids and computed count,
requests that finished or were not scheduled leave. A request that leaves frees its row; `condense`
moves the last rows into the holes so rows stay dense, and only then is the sampling state
(`sampling_metadata`) rebuilt, once per membership change, never on a steady decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tram.core.sched_output import CachedRequestData, SchedulerOutput
from tram.worker.block_table import MultiGroupBlockTable
from tram.worker.logits_processors import GrammarBitmaskProcessor, LogitsProcessor, SamplingRow
from tram.worker.sampling_metadata import SamplingMetadata, build_sampling_metadata, make_logits_processors


@dataclass(eq=False)
class CachedRequestState:
    req_id: str
    sampling: SamplingRow  # params, prompt ids, output ids (grown in place), generator
    block_ids: list[list[int]]  # per KV cache group
    num_prompt_logprobs_sent: int = 0  # prompt positions whose logprobs went out (never resent)

    @property
    def num_tokens(self) -> int:
        return len(self.sampling.prompt_token_ids) + len(self.sampling.output_token_ids)


class InputBatch:
    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        block_size: int,
        vocab_size: int,
        device: torch.device,
        num_kv_cache_groups: int = 1,
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.device = device
        self.states: list[CachedRequestState | None] = []  # row -> request (None: a hole)
        self.row_of: dict[str, int] = {}
        # One column more than a context holds: the token sampled at max_model_len ends the request
        # and is never fed back, but it is recorded like any other.
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)  # prompt + outputs known
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = MultiGroupBlockTable(
            num_kv_cache_groups, max_num_reqs, -(-max_model_len // block_size), device
        )
        self.processors: list[LogitsProcessor] = make_logits_processors(vocab_size, device)
        self.grammar_processor = next(p for p in self.processors if isinstance(p, GrammarBitmaskProcessor))
        self._sampling: SamplingMetadata | None = None  # None: membership changed since it was built
        self._prompt_logprobs_rows: list[int] | None = None

    # ---- membership ------------------------------------------------------------------------
    @property
    def num_reqs(self) -> int:
        return len(self.row_of)

    @property
    def req_ids(self) -> list[str]:
        """Request ids in row order (call after `condense`)."""
        return [s.req_id for s in self.states if s is not None]

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.row_of

    def add(self, state: CachedRequestState, num_computed_tokens: int) -> None:
        row = next((i for i, s in enumerate(self.states) if s is None), len(self.states))
        if row == len(self.states):
            assert row < self.max_num_reqs, "more requests in a step than max_num_seqs"
            self.states.append(None)
        self.states[row] = state
        self.row_of[state.req_id] = row
        prompt, output = state.sampling.prompt_token_ids, state.sampling.output_token_ids
        n_prompt, n = len(prompt), len(prompt) + len(output)
        self.token_ids[row, :n_prompt] = prompt
        self.token_ids[row, n_prompt:n] = output
        self.num_prompt_tokens[row], self.num_tokens[row] = n_prompt, n
        self.num_computed_tokens[row] = num_computed_tokens
        self.block_table.set_row(row, state.block_ids)
        self._sampling = None

    def remove(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is not None:
            self.states[row] = None
            self._sampling = None

    def condense(self) -> None:
        """Fill the holes left by removed requests with the last rows, so rows 0..num_reqs-1 are live."""
        while self.states and self.states[-1] is None:
            self.states.pop()
        for hole in range(len(self.states)):
            if hole >= len(self.states):
                break
            if self.states[hole] is None:
                self._move(len(self.states) - 1, hole)
                while self.states and self.states[-1] is None:
                    self.states.pop()

    def _move(self, src: int, dst: int) -> None:
        state = self.states[src]
        assert state is not None
        n = int(self.num_tokens[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        for column in (self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens):
            column[dst] = column[src]
        self.block_table.move_row(src, dst)
        self.states[dst], self.states[src] = state, None
        self.row_of[state.req_id] = dst

    # ---- per-step updates --------------------------------------------------------------------
    def append_blocks(self, req_id: str, block_ids: list[list[int]]) -> None:
        self.block_table.append(self.row_of[req_id], block_ids)

    def append_sampled(self, rows: np.ndarray, tokens: list[int]) -> None:
        """Record tokens sampled for `rows` (in the token table and each request's output list)."""
        self.token_ids[rows, self.num_tokens[rows]] = tokens
        self.num_tokens[rows] += 1
        for row, token in zip(rows.tolist(), tokens):
            state = self.states[row]
            assert state is not None
            state.sampling.output_token_ids.append(token)

    def append_tokens(self, tokens: dict[int, list[int]]) -> None:
        """Record each row's new tokens: one per row, or a drafted row's accepted drafts and one more."""
        if all(len(t) == 1 for t in tokens.values()):
            rows = np.fromiter(tokens, dtype=np.int64, count=len(tokens))
            self.append_sampled(rows, [t[0] for t in tokens.values()])
            return
        for row, new in tokens.items():
            n = int(self.num_tokens[row])
            self.token_ids[row, n : n + len(new)] = new
            self.num_tokens[row] = n + len(new)
            state = self.states[row]
            assert state is not None
            state.sampling.output_token_ids.extend(new)

    def sampling_metadata(self) -> SamplingMetadata:
        """The rows' sampling state, rebuilt only when membership or row order changed."""
        if self._sampling is None:
            rows = [s.sampling for s in self.states if s is not None]
            self._sampling = build_sampling_metadata(rows, self.vocab_size, self.device, self.processors)
            self._prompt_logprobs_rows = [i for i, r in enumerate(rows) if r.params.prompt_logprobs is not None]
        return self._sampling

    def prompt_logprobs_rows(self) -> list[int]:
        """Rows whose request asked for prompt logprobs."""
        self.sampling_metadata()
        assert self._prompt_logprobs_rows is not None
        return self._prompt_logprobs_rows


def apply_scheduler_output(
    batch: InputBatch, requests: dict[str, CachedRequestState], sched: SchedulerOutput, take_new_tokens: bool = False
) -> None:
    """Apply the scheduler's diff to the worker's request states and batch: afterwards the batch
    holds exactly this step's requests, condensed. take_new_tokens: a pipeline stage that does not
    sample appends the output tokens the scheduler sends (the sampling stage appends its own)."""
    for rid in sched.finished_req_ids:
        requests.pop(rid, None)
        batch.remove(rid)
    scheduled = sched.num_scheduled_tokens
    for rid in [r for r in batch.row_of if r not in scheduled]:
        batch.remove(rid)  # preempted, or left out of this step's budget: its state stays
    for new in sched.scheduled_new_reqs:
        generator = None
        if new.sampling_params.seed is not None:
            generator = torch.Generator(device=batch.device)
            generator.manual_seed(new.sampling_params.seed)
        sampling = SamplingRow(new.sampling_params, new.prompt_token_ids, [], generator, new.min_tokens_masked_ids)
        state = CachedRequestState(new.req_id, sampling, [list(ids) for ids in new.block_ids])
        requests[new.req_id] = state
        batch.add(state, new.num_computed_tokens)
    for cached in sched.scheduled_cached_reqs:
        state = requests[cached.req_id]
        if take_new_tokens and cached.new_token_ids:
            _take_tokens(batch, state, cached)
        if cached.resumed_from_preemption:
            state.block_ids = [list(ids) for ids in cached.new_block_ids]
        else:
            for held, new_ids in zip(state.block_ids, cached.new_block_ids, strict=True):
                held.extend(new_ids)
        if cached.req_id in batch and not cached.resumed_from_preemption:
            batch.append_blocks(cached.req_id, cached.new_block_ids)  # its computed count is already current
        else:
            batch.remove(cached.req_id)
            batch.add(state, cached.num_computed_tokens)
    batch.condense()


def _take_tokens(batch: InputBatch, state: CachedRequestState, cached: CachedRequestData) -> None:
    row = batch.row_of.get(cached.req_id)
    if row is None or cached.resumed_from_preemption:  # (re)added below from its state's outputs
        state.sampling.output_token_ids.extend(cached.new_token_ids)
        return
    rows = np.array([row])
    for token in cached.new_token_ids:
        batch.append_sampled(rows, [token])


def advance_computed(batch: InputBatch, sched: SchedulerOutput) -> None:
    """After the step's forward: every row computed the tokens it was scheduled."""
    n = batch.num_reqs
    batch.num_computed_tokens[:n] += [sched.num_scheduled_tokens[s.req_id] for s in batch.states[:n]]
