"""The model runner: applies the scheduler's diff to its persistent batch, runs one forward over the
flattened batch, and samples. It never sees text."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from tram.config import ModelConfig
from tram.config.speculative import SpeculativeConfig
from tram.core.kv_cache_groups import KVCacheLayout, plan_kv_cache_groups
from tram.core.sched_output import LogprobsLists, ModelRunnerOutput, SchedulerOutput
from tram.distributed import get_pp, pp_recv, pp_send
from tram.model.attention.kv_quant import kv_cache_torch_dtype
from tram.model.kernels.cpu_kernels import argmax_rows, load_cpu_kernels
from tram.model.loader import load_model
from tram.model.pipeline import layer_range
from tram.model.registry import kv_cache_shape_info
from tram.worker.cpu_memory import keep_freed_memory
from tram.worker.cuda_graph import DecodeGraphRunner
from tram.worker.input_batch import CachedRequestState, InputBatch, advance_computed, apply_scheduler_output
from tram.worker.kv_cache import allocate_kv_caches, bind_kv_cache_groups
from tram.worker.memory_profiler import MemoryProfile, profile_cuda_memory, run_dummy_step
from tram.worker.rejection_sampler import DraftRows, accept_drafts, verify_drafts
from tram.worker.sampler import LogprobsTensors, Sampler, compute_token_logprobs
from tram.worker.sampling_metadata import SamplingMetadata
from tram.worker.spec_step import (
    Drafter,
    draft_rows,
    drafted,
    grammar_masked,
    logits_rows,
    roll_back,
    write_drafts,
)
from tram.worker.step_inputs import PromptLogprobsJob, StepBuffers, StepInputs, prepare_inputs

if TYPE_CHECKING:
    from tram.spec_decode.draft_model import DraftModelProposer

logger = logging.getLogger(__name__)
# Tokens in the CPU warm-up step: a long prompt, yet ~2.5 TFLOP for a 1B model, seconds on a small CPU.
CPU_WARMUP_TOKENS = 1024


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_cache_dtype: str,
        kv_cache_layout: KVCacheLayout | None = None,
        speculative_config: SpeculativeConfig | None = None,
    ) -> None:
        # No defaults here: the worker passes the resolved CacheConfig and SchedulerConfig values
        # (a layout of None: one KV cache group of every layer).
        model_config.resolve()
        self.model_config = model_config
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.device = model_config.torch_device
        self.dtype = model_config.torch_dtype
        self.kv_cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, self.dtype)
        self.block_size = block_size
        self.vocab_size = model_config.vocab_size
        self.model = load_model(model_config)
        if self.device.type == "cpu":
            keep_freed_memory()
            # Build (first run on a machine, minutes) or load the C++ kernels now, not in the first
            # request's step.
            load_cpu_kernels()
        self.num_layers, self.num_kv_heads, self.head_dim = kv_cache_shape_info(model_config.hf_config)
        pp = get_pp()
        total_layers = int(model_config.hf_config.num_hidden_layers)
        self.stage_layers = range(*layer_range(total_layers, pp.rank, pp.size))
        self.kv_cache_layout = kv_cache_layout or plan_kv_cache_groups([None] * total_layers)
        bind_kv_cache_groups(self.model, self.kv_cache_layout, self.stage_layers)
        num_groups = self.kv_cache_layout.num_groups
        self.sampler = Sampler()
        self.drafter = None
        if speculative_config is not None:
            self.drafter = Drafter(speculative_config)
            if self.drafter.batched:
                self.drafter.proposer.attach(self.model)
            logger.info("Speculative decoding: %s", speculative_config)
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(
            max_num_seqs, model_config.max_model_len, block_size, self.vocab_size, self.device, num_groups
        )
        # Decode steps have one token per request, so the buffers must hold max_num_seqs tokens too; a
        # verification step attends each of its tokens as a row of its own (step_inputs.py).
        rows = max_num_seqs
        if speculative_config is not None:
            chunk = 1 + speculative_config.num_speculative_tokens
            rows = max(rows, min(max_num_seqs * chunk, max_num_batched_tokens))
        self.buffers = StepBuffers(max(max_num_batched_tokens, max_num_seqs), rows, self.device, num_groups)
        self.kv_caches: list[torch.Tensor] = []
        self.graph_runner: DecodeGraphRunner | None = None

    # ---- KV cache ------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        """Bytes of one pool block on this rank: a block of every cache tensor (slot) it holds."""
        elem = torch.empty((), dtype=self.kv_cache_dtype).element_size()
        num_slots = len(self.kv_cache_layout.slots_of(self.stage_layers))
        target = 2 * num_slots * self.block_size * self.num_kv_heads * self.head_dim * elem
        draft = self._draft_model()
        if draft is None:
            return target
        return target + 2 * draft.num_layers * self.block_size * draft.num_kv_heads * draft.head_dim * elem

    def _draft_model(self) -> DraftModelProposer | None:
        """The draft-model proposer, whose K/V shares the target's blocks (None: no such proposer)."""
        return self.drafter.proposer if self.drafter is not None and self.drafter.batched else None

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = allocate_kv_caches(
            self.kv_cache_layout,
            self.stage_layers,
            num_blocks,
            (self.block_size, self.num_kv_heads, self.head_dim),
            self.kv_cache_dtype,
            self.device,
        )
        draft = self._draft_model()
        if draft is not None:  # one KV cache group, every layer in it (the engine refuses windows)
            layout = plan_kv_cache_groups([None] * draft.num_layers)
            shape = (self.block_size, draft.num_kv_heads, draft.head_dim)
            caches = allocate_kv_caches(
                layout, range(draft.num_layers), num_blocks, shape, self.kv_cache_dtype, self.device
            )
            draft.bind_kv_caches(caches, self.block_size)
        if self._use_cuda_graphs():
            self.capture_cuda_graphs()
        if self.device.type == "cpu":
            self.warm_up()

    def warm_up(self) -> None:
        """CPU: one dummy prefill before the first request, so that request does not pay for growing
        the heap (a page fault per 4 KiB page), MKL's buffers and the
        thread pool; with `keep_freed_memory` the memory stays for later steps. Capped so a large
        model does not spend long here; a longer first prompt grows the heap once more."""
        tokens = min(self.max_num_batched_tokens, CPU_WARMUP_TOKENS)
        start = time.perf_counter()
        run_dummy_step(self, tokens, min(self.max_num_seqs, tokens))
        logger.info("Warmed up the model with a %d-token step in %.2f s", tokens, time.perf_counter() - start)

    def _use_cuda_graphs(self) -> bool:
        # Graphs need a backend that plans nothing on the host; the PyTorch backend does. Pipeline
        # stages talk between their layers, which a captured graph cannot.
        mc = self.model_config
        # The decode graphs are captured over one block table and slot mapping: a hybrid cache
        # (several groups) runs eagerly for now.
        return (
            self.device.type == "cuda"
            and not mc.enforce_eager
            and mc.attention_backend == "triton"
            and get_pp().size == 1
            and self.kv_cache_layout.num_groups == 1
            # An EAGLE-3 head reads the target's aux hidden states, which a replay does not hand back.
            and (self.drafter is None or self.drafter.config.method != "eagle3")
        )

    def capture_cuda_graphs(self, use_graphs: bool = True) -> None:
        """Decode graphs for batch-size buckets up to max_num_seqs (capped at 512, as vLLM), over the
        persistent batch's own input buffers."""
        self.graph_runner = DecodeGraphRunner(
            self.model,
            self.kv_caches,
            self.buffers,
            self.input_batch.block_table[0],
            min(self.max_num_seqs, 512),
            self.model_config.max_model_len,
            self.num_kv_heads,
            use_graphs=use_graphs,
        )
        seconds = self.graph_runner.capture()
        logger.info(
            "Captured decode CUDA graphs for %d batch sizes (up to %d) in %.1f s",
            len(self.graph_runner.sizes),
            self.graph_runner.sizes[-1],
            seconds,
        )

    def profile_memory(self) -> MemoryProfile:
        """Peak GPU memory of the largest step (max_num_batched_tokens), for sizing the KV cache."""
        return profile_cuda_memory(self, self.max_num_batched_tokens, self.max_num_seqs)

    # ---- one step ------------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        pp = get_pp()
        # The stages that do not sample take the new tokens from the scheduler (CachedRequestData).
        apply_scheduler_output(self.input_batch, self.requests, sched, take_new_tokens=not pp.is_last)
        self._set_grammar_bitmask(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        start = time.perf_counter()
        if self.drafter is not None:
            self.drafter.begin_step(self.input_batch, sched)
        drafted = self.drafter is not None and self.drafter.drafting
        num_drafts = write_drafts(self.input_batch, sched.scheduled_spec_decode_tokens)
        inputs = prepare_inputs(self.input_batch, sched, self.buffers, self.block_size, num_drafts)
        # The graphs read their requests' block tables from the batch's rows; a verification step's
        # attended rows are its tokens.
        if self.graph_runner is not None and num_drafts is None and self.graph_runner.can_run(inputs.meta):
            hidden = self.graph_runner.run(inputs.input_ids, inputs.positions, inputs.meta)
        elif pp.size > 1:
            hidden = self._pipeline_stage(inputs)
            if not pp.is_last:  # its part is done: the next stage has the hidden states
                advance_computed(self.input_batch, sched)
                return ModelRunnerOutput()
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        if self.drafter is not None:
            self.drafter.run_step(self.input_batch, sched, inputs, hidden)
        out = ModelRunnerOutput(sampled_token_ids={}, logprobs={}, prompt_logprobs={}, spec_token_ids={})
        produced: dict[int, int] = {}
        if inputs.sample_rows.any():
            produced = self._sample(hidden, inputs, out, sched, num_drafts)
        elif self.drafter is not None:
            self.drafter.after_step(self.input_batch, inputs)
        for job in inputs.prompt_logprobs_jobs:
            out.prompt_logprobs[job.req_id] = self._prompt_logprobs(hidden, job)
        advance_computed(self.input_batch, sched)
        roll_back(self.input_batch, num_drafts, produced)
        if self.drafter is not None and inputs.meta.max_query_len == 1:  # a decode step: its side's rate
            made = sum(len(t) for t in out.sampled_token_ids.values())
            self.drafter.record(self.input_batch.num_reqs, drafted, made, time.perf_counter() - start)
        return out

    def _pipeline_stage(self, inputs: StepInputs) -> torch.Tensor:
        """This stage's layers over the step: the previous stage's hidden states in, ours out (sent on
        unless this is the last stage, which samples)."""
        pp = get_pp()
        received = None
        if not pp.is_first:
            shape = (inputs.input_ids.shape[0], self.model_config.hf_config.hidden_size)
            received = pp_recv(shape, self.dtype, self.device)  # [T, hidden]
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, received)
        if not pp.is_last:
            pp_send(hidden)
        return hidden

    def _set_grammar_bitmask(self, sched: SchedulerOutput) -> None:
        """Hand the step's grammar bitmask (filled by the engine core) to its logits processor,
        with each request's row in this step's batch."""
        processor = self.input_batch.grammar_processor
        bm = sched.grammar_bitmask
        if bm is None:
            processor.set_step(None)
            return
        rows = [self.input_batch.row_of[rid] for rid in bm.req_ids]
        bitmask = np.frombuffer(bm.data, dtype=np.int32).reshape(-1, bm.words)
        processor.set_step(rows, bitmask, bm.num_rows)

    def _sample(
        self,
        hidden: torch.Tensor,
        inputs: StepInputs,
        out: ModelRunnerOutput,
        sched: SchedulerOutput,
        num_drafts: np.ndarray | None,
    ) -> dict[int, int]:
        """Every row gets logits and a draw (keeping the batch's sampling tensors aligned with its
        rows); rows still in the middle of their prompt drop theirs, and their seeded generators
        are left untouched, so they draw nothing from them. Drafted rows then verify their drafts
        (rejection_sampler.py), the draw serving as the token past the last draft. Returns how many
        tokens each drafted row got."""
        batch = self.input_batch
        meta = batch.sampling_metadata()
        draft_logits = None
        if num_drafts is None:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [B, V] float32
        else:  # one LM-head call for the rows' last positions and their drafts'
            rows, last, drafts = logits_rows(num_drafts, inputs.chunk_ends)
            # Rows are ascending and distinct: as many as the hidden rows means all of them.
            needed = hidden if len(rows) == hidden.shape[0] else hidden[torch.from_numpy(rows).to(hidden.device)]
            every = self.model.compute_logits(needed)
            if meta.plain_greedy:
                return self._verify_greedy(every, last, drafts, inputs, out, sched, num_drafts, meta)
            logits, draft_logits = every[torch.from_numpy(last)], every[torch.from_numpy(drafts)]
        sample_rows = inputs.sample_rows
        d = None
        if draft_logits is not None:
            d = draft_rows(batch, sched.scheduled_spec_decode_tokens, num_drafts, draft_logits)
            if meta.generators or meta.max_num_logprobs is not None:  # read by seeded rows and logprobs
                d.last_logits = logits[torch.tensor(d.rows)]  # a copy: the sampler may edit `logits` in place
        # A seeded row draws only the positions it keeps (rejection_sampler.py): a drafted one's draw
        # below is discarded, and must not move its generator.
        skip = sample_rows if num_drafts is None else sample_rows & (num_drafts == 0)
        result = self.sampler(logits, _with_generators_of(meta, skip))
        row_list = sample_rows.nonzero()[0].tolist()
        tokens = result.sampled_token_ids.tolist()
        chosen = {i: [tokens[i]] for i in row_list}
        produced: dict[int, list[int]] = {}
        if d is not None:
            verify = grammar_masked(d, batch.grammar_processor)
            produced = dict(zip(d.rows, verify_drafts(verify, [tokens[r] for r in d.rows], meta)))
            chosen.update(produced)
        self._emit(chosen, row_list, inputs, out, meta)
        if result.logprobs is not None:
            self._logprobs(result.logprobs, row_list, out)
            if d is not None:
                self._draft_logprobs(d, produced, meta.max_num_logprobs or 0, out)
        return {row: len(got) for row, got in produced.items()}

    def _verify_greedy(
        self,
        every: torch.Tensor,
        last: np.ndarray,
        drafts: np.ndarray,
        inputs: StepInputs,
        out: ModelRunnerOutput,
        sched: SchedulerOutput,
        num_drafts: np.ndarray,
        meta: SamplingMetadata,
    ) -> dict[int, int]:
        """A verification step of greedy rows that nothing else touches (`SamplingMetadata.plain_greedy`):
        one argmax over every position gives each row's last draw and the draws its drafts must equal."""
        best = argmax_rows(every).tolist()
        tokens = [best[i] for i in last.tolist()]
        rows, row_drafts = drafted(self.input_batch, sched.scheduled_spec_decode_tokens, num_drafts)
        got = accept_drafts(row_drafts, [best[i] for i in np.flatnonzero(drafts).tolist()], [tokens[r] for r in rows])
        row_list = inputs.sample_rows.nonzero()[0].tolist()
        chosen = {i: [tokens[i]] for i in row_list}
        chosen.update(zip(rows, got))
        self._emit(chosen, row_list, inputs, out, meta)
        return {row: len(g) for row, g in zip(rows, got)}

    def _emit(
        self,
        chosen: dict[int, list[int]],
        row_list: list[int],
        inputs: StepInputs,
        out: ModelRunnerOutput,
        meta: SamplingMetadata,
    ) -> None:
        """The step's tokens into the batch and the output; the proposer's drafts for the next step."""
        batch = self.input_batch
        batch.append_tokens(chosen)
        for i in row_list:
            out.sampled_token_ids[batch.states[i].req_id] = chosen[i]  # type: ignore[union-attr]
        if self.drafter is not None:
            self.drafter.after_step(batch, inputs)
            out.spec_token_ids = self.drafter.propose(batch, row_list, meta.processors)

    def _draft_logprobs(self, d: DraftRows, produced: dict[int, list[int]], num: int, out: ModelRunnerOutput) -> None:
        """A drafted row's logprobs: a row per token it got, from the raw logits of that token's position
        (a draft's, or past the last draft for the bonus token)."""
        start = 0
        for i, row in enumerate(d.rows):
            drafts, got = d.drafts[i], produced[row]
            state = self.input_batch.states[row]
            assert state is not None and d.last_logits is not None
            k = state.sampling.params.logprobs
            if k is not None:
                n = min(len(got), len(drafts))
                raw = torch.cat([d.logits[start : start + n], d.last_logits[i : i + 1][: len(got) - n]])
                targets = torch.tensor(got, device=raw.device)
                ids, lps, ranks = compute_token_logprobs(raw, targets, num).tolists()
                cols = len(ids[0]) if k < 0 else k + 1
                out.logprobs[state.req_id] = LogprobsLists([r[:cols] for r in ids], [r[:cols] for r in lps], ranks)
            start += len(drafts)

    def _logprobs(self, logprobs: LogprobsTensors, row_list: list[int], out: ModelRunnerOutput) -> None:
        ids, lps, ranks = logprobs.tolists()
        for i in row_list:
            state = self.input_batch.states[i]
            assert state is not None
            k = state.sampling.params.logprobs
            if k is None:
                continue
            cols = len(ids[i]) if k < 0 else k + 1
            out.logprobs[state.req_id] = LogprobsLists([ids[i][:cols]], [lps[i][:cols]], [ranks[i]])

    def _prompt_logprobs(self, hidden: torch.Tensor, job: PromptLogprobsJob) -> LogprobsLists:
        k = self.requests[job.req_id].sampling.params.prompt_logprobs
        idx = torch.from_numpy(job.hidden_indices).to(self.device)
        logits = self.model.compute_logits(hidden[idx])
        num = self.vocab_size if k < 0 else k
        targets = torch.tensor(job.target_token_ids, dtype=torch.long, device=self.device)
        return LogprobsLists(*compute_token_logprobs(logits, targets, num).tolists())


def _with_generators_of(meta: SamplingMetadata, rows: np.ndarray) -> SamplingMetadata:
    """`meta` with the seeded generators of `rows` only (the others draw nothing from theirs)."""
    if not meta.generators or all(rows[i] for i in meta.generators):
        return meta
    return dataclasses.replace(meta, generators={i: g for i, g in meta.generators.items() if rows[i]})
