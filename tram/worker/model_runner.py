"""The model runner: applies the scheduler's diff to its request state, runs one forward over the
flattened batch, and samples. It never sees text."""
from __future__ import annotations

import logging
import time

import torch

from tram.config import ModelConfig
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.engine.messages import LogprobsLists
from tram.model.cpu_kernels import load_cpu_kernels
from tram.model.loader import load_model
from tram.model.registry import kv_cache_shape_info
from tram.worker.cpu_memory import keep_freed_memory
from tram.worker.cuda_graph import DecodeGraphRunner
from tram.worker.input_batch import CachedRequestState, PromptLogprobsJob, StepInputs, prepare_inputs
from tram.worker.memory_profiler import MemoryProfile, profile_cuda_memory, run_dummy_step
from tram.worker.sampler import Sampler, compute_token_logprobs
from tram.worker.sampling_metadata import SamplingRow, build_sampling_metadata

logger = logging.getLogger(__name__)
# Tokens in the CPU warm-up step: a long prompt, and ~2.5 TFLOP for a 1B model (about 12 s on 2 cores).
CPU_WARMUP_TOKENS = 1024


class ModelRunner:
    def __init__(
        self, model_config: ModelConfig, block_size: int, max_num_seqs: int = 256,
        max_num_batched_tokens: int = 4096,
    ) -> None:
        model_config.resolve()
        self.model_config = model_config
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.device = model_config.torch_device
        self.dtype = model_config.torch_dtype
        self.block_size = block_size
        self.vocab_size = model_config.vocab_size
        self.model = load_model(model_config)
        if self.device.type == "cpu":
            keep_freed_memory()
            # Build (first run on a machine, ~40 s) or load the C++ kernels now, not in the first
            # request's step.
            load_cpu_kernels()
        self.num_layers, self.num_kv_heads, self.head_dim = kv_cache_shape_info(model_config.hf_config)
        self.sampler = Sampler()
        self.requests: dict[str, CachedRequestState] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.graph_runner: DecodeGraphRunner | None = None

    # ---- KV cache ------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def initialize_kv_cache(self, num_blocks: int) -> None:
        # Zeros, not empty: padded attention reads masked slots, and 0 * NaN would poison outputs.
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self._use_cuda_graphs():
            self.capture_cuda_graphs()
        if self.device.type == "cpu":
            self.warm_up()

    def warm_up(self) -> None:
        """CPU: one dummy prefill before the first request, so that request does not pay for growing
        the heap (a page fault per 4 KiB page, ~6 us each on this project's VM), MKL's buffers and the
        thread pool; with `keep_freed_memory` the memory stays for later steps. Capped so a large
        model does not spend long here; a longer first prompt grows the heap once more."""
        tokens = min(self.max_num_batched_tokens, CPU_WARMUP_TOKENS)
        start = time.perf_counter()
        run_dummy_step(self, tokens, min(self.max_num_seqs, tokens))
        logger.info("Warmed up the model with a %d-token step in %.2f s", tokens, time.perf_counter() - start)

    def _use_cuda_graphs(self) -> bool:
        # Graphs need a backend that plans nothing on the host; the PyTorch backend does.
        mc = self.model_config
        return self.device.type == "cuda" and not mc.enforce_eager and mc.attention_backend == "triton"

    def capture_cuda_graphs(self, use_graphs: bool = True) -> None:
        """Decode graphs for batch-size buckets up to max_num_seqs (capped at 512, as vLLM)."""
        self.graph_runner = DecodeGraphRunner(
            self.model, self.kv_caches, min(self.max_num_seqs, 512), self.model_config.max_model_len,
            self.block_size, self.num_kv_heads, self.device, use_graphs=use_graphs,
        )
        seconds = self.graph_runner.capture()
        logger.info("Captured decode CUDA graphs for %d batch sizes (up to %d) in %.1f s",
                    len(self.graph_runner.sizes), self.graph_runner.sizes[-1], seconds)

    def profile_memory(self) -> MemoryProfile:
        """Peak GPU memory of the largest step (max_num_batched_tokens), for sizing the KV cache."""
        return profile_cuda_memory(self, self.max_num_batched_tokens, self.max_num_seqs)

    # ---- one step ------------------------------------------------------------------------
    def _update_states(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids:
            self.requests.pop(rid, None)
        for new in sched.scheduled_new_reqs:
            params = new.sampling_params
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(params.seed)
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, new.prompt_token_ids, params, list(new.block_ids), new.num_computed_tokens,
                new.min_tokens_masked_ids, gen,
            )
        for cached in sched.scheduled_cached_reqs:
            st = self.requests[cached.req_id]
            if cached.resumed_from_preemption:
                st.block_ids = list(cached.new_block_ids)
            else:
                st.block_ids.extend(cached.new_block_ids)
            st.num_computed_tokens = cached.num_computed_tokens

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        inputs = prepare_inputs(self.requests, sched, self.block_size, self.device)
        if self.graph_runner is not None and self.graph_runner.can_run(inputs.meta):
            hidden = self.graph_runner.run(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        out = ModelRunnerOutput(sampled_token_ids={}, logprobs={}, prompt_logprobs={})
        if inputs.sample_req_ids:
            self._sample(hidden, inputs, out)
        for job in inputs.prompt_logprobs_jobs:
            out.prompt_logprobs[job.req_id] = self._prompt_logprobs(hidden, job)
        for rid, n in sched.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n
        return out

    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, out: ModelRunnerOutput) -> None:
        logits = self.model.compute_logits(hidden[inputs.sample_indices])  # [S, V] float32
        states = [self.requests[rid] for rid in inputs.sample_req_ids]
        rows = [
            SamplingRow(st.sampling_params, st.prompt_token_ids, st.output_token_ids, st.generator, st.stop_token_ids)
            for st in states
        ]
        meta = build_sampling_metadata(rows, self.vocab_size, self.device)
        result = self.sampler(logits, meta)
        tokens = result.sampled_token_ids.tolist()
        for st, tok in zip(states, tokens):
            st.append_output_token(tok)
            out.sampled_token_ids[st.req_id] = tok
        if result.logprobs is not None:
            ids, lps, ranks = result.logprobs.tolists()
            for i, st in enumerate(states):
                k = st.sampling_params.logprobs
                if k is None:
                    continue
                cols = len(ids[i]) if k < 0 else k + 1
                out.logprobs[st.req_id] = LogprobsLists([ids[i][:cols]], [lps[i][:cols]], [ranks[i]])

    def _prompt_logprobs(self, hidden: torch.Tensor, job: PromptLogprobsJob) -> LogprobsLists:
        st = self.requests[job.req_id]
        k = st.sampling_params.prompt_logprobs
        idx = torch.from_numpy(job.hidden_indices).to(self.device)
        logits = self.model.compute_logits(hidden[idx])
        num = self.vocab_size if k < 0 else k
        targets = torch.tensor(job.target_token_ids, dtype=torch.long, device=self.device)
        return LogprobsLists(*compute_token_logprobs(logits, targets, num).tolists())
