"""The persistent input batch equals a batch rebuilt from scratch, whatever happened before.

The real scheduler (small cache, small token budget: chunked prefill, waiting and preemption) drives
the worker's persistent batch through random sequences of arrivals, aborts and steps; the model is
replaced by random sampled tokens. After every step the batch's flattened inputs, block tables and
sampling state must equal what a from-scratch build gives from the requests' own state, and its
logits processors must edit logits exactly as freshly built ones do.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tram.config import CacheConfig, SchedulerConfig
from tram.core.request import Request, RequestStatus
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.core.scheduler import Scheduler
from tram.sampling_params import SamplingParams
from tram.worker.input_batch import CachedRequestState, InputBatch, advance_computed, apply_scheduler_output
from tram.worker.logits_processors import SamplingRow, Stage
from tram.worker.sampler import apply_logits_processors
from tram.worker.sampling_metadata import SamplingMetadata, build_sampling_metadata
from tram.worker.step_inputs import StepBuffers, prepare_inputs

VOCAB, BLOCK, MAX_LEN, MAX_SEQS, EOS = 64, 4, 48, 4, [2, 1]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=6),
    SamplingParams(temperature=0.8, seed=7, max_tokens=9, min_p=0.1, logprobs=2),
    SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.4, max_tokens=12),
    SamplingParams(temperature=1.0, presence_penalty=-0.5, top_k=5, top_p=0.9, max_tokens=7),
    SamplingParams(temperature=0, min_tokens=4, stop_token_ids=[5], max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0, logit_bias={3: 2.0, 9: -1.0}, max_tokens=5, prompt_logprobs=1),
]

operation = st.one_of(
    st.tuples(
        st.just("add"), st.lists(st.tuples(st.integers(1, 20), st.integers(0, len(PARAMS) - 1)), min_size=1, max_size=4)
    ),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("steps"), st.integers(0, 2**31), st.integers(1, 8)),
)


def _scratch_meta(rows: list[SamplingRow]) -> SamplingMetadata:
    """Fresh copies of the rows (so nothing is shared with the persistent processors)."""
    copies = [
        SamplingRow(r.params, list(r.prompt_token_ids), list(r.output_token_ids), r.generator, r.min_tokens_masked_ids)
        for r in rows
    ]
    return build_sampling_metadata(copies, VOCAB, "cpu")


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None) == (b is None) and (a is None or torch.equal(a, b))


def _check_sampling(batch: InputBatch, step_seed: int) -> None:
    meta = batch.sampling_metadata()
    ref = _scratch_meta([s.sampling for s in batch.states[: batch.num_reqs]])
    assert (meta.all_greedy, meta.all_random, meta.max_top_k, meta.max_num_logprobs) == (
        ref.all_greedy,
        ref.all_random,
        ref.max_top_k,
        ref.max_num_logprobs,
    )
    assert _same(meta.temperature, ref.temperature) and _same(meta.top_k, ref.top_k) and _same(meta.top_p, ref.top_p)
    assert _same(meta.min_p, ref.min_p) and meta.generators.keys() == ref.generators.keys()
    logits = torch.randn(batch.num_reqs, VOCAB, generator=torch.Generator().manual_seed(step_seed))
    for stage in Stage:
        got = apply_logits_processors(logits.clone(), meta, stage)
        want = apply_logits_processors(logits.clone(), ref, stage)
        assert torch.equal(got, want), stage


def _check_inputs(
    batch: InputBatch,
    sched: SchedulerOutput,
    scheduler: Scheduler,
    buffers: StepBuffers,
    prompt_logprobs: dict[str, list[int]],
) -> np.ndarray:
    """The step's inputs, per request, against the requests' own token lists and block ids."""
    inputs = prepare_inputs(batch, sched, buffers, BLOCK)
    for job in inputs.prompt_logprobs_jobs:  # each prompt position's logprob is sent once, in order
        sent = prompt_logprobs.setdefault(job.req_id, [])
        sent.extend(job.target_token_ids)
        assert sent == scheduler.requests[job.req_id].prompt_token_ids[1 : len(sent) + 1]
    assert sorted(batch.req_ids) == sorted(sched.num_scheduled_tokens)
    meta, offset = inputs.meta, 0
    for row, rid in enumerate(batch.req_ids):
        req, n = scheduler.requests[rid], sched.num_scheduled_tokens[rid]
        start = req.num_computed_tokens - n  # the scheduler already counted this step's tokens
        (blocks,) = scheduler.kv_cache_manager.get_block_ids(rid)
        positions = list(range(start, start + n))
        assert inputs.positions[offset : offset + n].tolist() == positions
        assert inputs.input_ids[offset : offset + n].tolist() == req.all_token_ids[start : start + n]
        assert meta.slot_mapping[offset : offset + n].tolist() == [
            blocks[p // BLOCK] * BLOCK + p % BLOCK for p in positions
        ]
        assert (meta.query_lens_list[row], meta.seq_lens_list[row]) == (n, start + n)
        used = -(-(start + n) // BLOCK)
        assert meta.block_tables[row, :used].tolist() == blocks[:used]
        assert bool(inputs.sample_rows[row]) == (start + n == req.num_tokens)
        assert int(inputs.logits_indices[row]) == offset + n - 1
        offset += n
    assert offset == meta.num_tokens == sched.total_num_scheduled_tokens
    return inputs.sample_rows


@settings(max_examples=80, deadline=None)
@given(st.lists(operation, min_size=1, max_size=30))
def test_persistent_batch_equals_a_batch_rebuilt_from_scratch(ops: list[tuple]) -> None:
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=12, max_model_len=MAX_LEN),
        CacheConfig(block_size=BLOCK, num_blocks=10, enable_prefix_caching=True),
    )
    batch = InputBatch(MAX_SEQS, MAX_LEN, BLOCK, VOCAB, torch.device("cpu"))
    buffers = StepBuffers(12, MAX_SEQS, torch.device("cpu"))
    states: dict[str, CachedRequestState] = {}
    prompt_logprobs: dict[str, list[int]] = {}  # the prompt logprob targets sent so far, per request
    added: list[str] = []
    for op in ops:
        if op[0] == "add":
            for length, which in op[1]:
                rid = f"r{len(added)}"
                prompt = [(7 * (len(added) % 3) + 3 * i) % VOCAB for i in range(length)]  # shared prefixes
                scheduler.add_request(Request(rid, prompt, PARAMS[which].clone(), EOS, MAX_LEN))
                added.append(rid)
        elif op[0] == "abort" and added:
            scheduler.finish_requests([added[op[1] % len(added)]], RequestStatus.FINISHED_ABORTED)
        elif op[0] == "steps":
            for k in range(op[2]):
                _step(scheduler, batch, buffers, states, op[1] + k, prompt_logprobs)
    for k in range(200):  # drain: every request finishes, and nothing leaks
        if not scheduler.has_unfinished_requests():
            break
        _step(scheduler, batch, buffers, states, k, prompt_logprobs)
    assert not scheduler.has_unfinished_requests()
    counts = scheduler.kv_cache_manager.check_integrity()
    assert counts["in_use"] == 0
    apply_scheduler_output(batch, states, scheduler.schedule())  # the last finished ids reach the worker
    assert batch.num_reqs == 0 and not states


def _step(
    scheduler: Scheduler,
    batch: InputBatch,
    buffers: StepBuffers,
    states: dict[str, CachedRequestState],
    seed: int,
    prompt_logprobs: dict[str, list[int]],
) -> None:
    """One engine step with random tokens for the model's."""
    sched = scheduler.schedule()
    apply_scheduler_output(batch, states, sched)
    if sched.is_empty:
        return
    sample_rows = _check_inputs(batch, sched, scheduler, buffers, prompt_logprobs)
    _check_sampling(batch, seed)
    rng = random.Random(seed)
    rows = np.nonzero(sample_rows)[0]
    tokens = [rng.randrange(VOCAB) for _ in rows]
    sampled = {batch.req_ids[r]: [tok] for r, tok in zip(rows, tokens)}
    batch.append_sampled(rows, tokens)
    advance_computed(batch, sched)
    scheduler.update_from_output(sched, ModelRunnerOutput(sampled_token_ids=sampled))
    for rid, state in states.items():  # the worker's view of every live request agrees with the core's
        if rid in scheduler.requests:
            req = scheduler.requests[rid]
            assert state.sampling.output_token_ids == req.output_token_ids
            if req.sampling_params.prompt_logprobs is not None and req.output_token_ids:
                assert prompt_logprobs.get(rid, []) == req.prompt_token_ids[1:]  # all of them, once
