"""Pipeline parallelism on CPU, for real: stages in their own processes, hidden states sent between
them, two steps in flight at once; greedy output identical to transformers (PP=2 and TP=2 x PP=2),
an uneven split (5 layers over 2 stages), and chunked prefill, preemption and seeded sampling
unchanged against one rank."""

from __future__ import annotations

import random

import pytest
from conftest import STORIES_EOS, assert_no_leak, hf_greedy, hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams
from tram.model.pipeline import layer_range

PROMPTS = ["Once upon a time", "Tom and his dog", "The little bird", "Lily wanted to", "One day, a big"]


def test_layer_ranges_split_evenly_with_earlier_stages_longer():
    assert [layer_range(5, s, 2) for s in range(2)] == [(0, 3), (3, 5)]
    assert [layer_range(8, s, 3) for s in range(3)] == [(0, 3), (3, 6), (6, 8)]
    with pytest.raises(ValueError, match="exceeds the model's 2 layers"):
        layer_range(2, 0, 3)


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 512) for _ in range(rng.randrange(5, 60))] for _ in range(count)]


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)])
def test_stories_greedy_and_logprobs_match_transformers(stories_path: str, tp: int, pp: int):
    # stories260K has 5 layers: 3 on the first stage, 2 on the second.
    llm = LLM(
        stories_path,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_seqs=16,
        max_model_len=128,
        max_num_batched_tokens=16,
    )  # prompts longer than 16 tokens are chunked
    try:
        assert llm.llm_engine.engine_core.executor.world_size == tp * pp
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
        for out in outs:
            assert out.outputs[0].token_ids == hf_greedy(stories_path, out.prompt_token_ids, 48, STORIES_EOS)
        out = llm.generate("Tom and his dog", SamplingParams(temperature=0, max_tokens=12, logprobs=3), use_tqdm=False)[
            0
        ]
        comp = out.outputs[0]
        ref = hf_logprobs(stories_path, out.prompt_token_ids + comp.token_ids)
        p = len(out.prompt_token_ids)
        for i, row in enumerate(comp.logprobs):
            for tid, lp in row.items():
                assert lp.logprob == pytest.approx(ref[p - 1 + i, tid].item(), abs=1e-4)
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_preemption_chunking_and_seeded_sampling_match_one_rank(stories_path: str):
    prompts = [{"prompt_token_ids": p} for p in _prompts(5, 8)]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.95, seed=3, max_tokens=40, ignore_eos=True),
    ]
    one = LLM(stories_path, max_num_seqs=8, max_model_len=128)
    expected = [[o.outputs[0].token_ids for o in one.generate(prompts, sp, use_tqdm=False)] for sp in params]
    # 12 blocks of 16 tokens for 8 requests of up to ~100 tokens: preemption and recompute, whose
    # resumed requests must bring their earlier tokens to the first stage.
    llm = LLM(
        stories_path,
        pipeline_parallel_size=2,
        max_num_seqs=8,
        max_model_len=128,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=24,
        enable_prefix_caching=False,
    )
    core = llm.llm_engine.engine_core
    assert core.step_fn == core.step_with_batch_queue
    submit, in_flight = core.executor.submit_model, []

    def watched_submit(sched):
        in_flight.append(len(core.batch_queue))  # steps already in flight when this one is submitted
        return submit(sched)

    core.executor.submit_model = watched_submit
    try:
        for sp, want in zip(params, expected):
            assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)] == want
        assert llm.llm_engine.get_stats().num_preemptions > 0
        assert max(in_flight) == 1  # two steps in flight at once (one per stage), never more
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("kind", ["llama_gqa", "llama_untied"])  # a head tied to the embedding, and one not
def test_random_models_greedy_match_transformers(tmp_path, kind: str):
    path = make_hf_model_dir(tmp_path, kind, num_hidden_layers=3)
    rng = random.Random(kind)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    llm = LLM(path, pipeline_parallel_size=2, max_num_seqs=8, max_num_batched_tokens=32, max_model_len=128)
    try:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            use_tqdm=False,
        )
        for prompt, out in zip(prompts, outs):
            assert out.outputs[0].token_ids == hf_greedy(path, prompt, 16, None), f"{kind}: {prompt}"
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()
