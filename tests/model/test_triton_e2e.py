"""The whole engine on the Triton backend, run by Triton's interpreter on CPU (conftest sets
TRITON_INTERPRET=1): greedy tokens must equal transformers', with chunked prefill, prefix caching
and the padded CUDA-graph decode path."""

from __future__ import annotations

import pytest
from conftest import STORIES, STORIES_EOS, assert_no_leak, hf_greedy

from tram import LLM, SamplingParams

PROMPTS = ["Once upon a time", "Tom and his dog went to the park. They", "The sun"]


@pytest.fixture(scope="module")
def triton_llm() -> LLM:
    # A small token budget forces chunked prefill; the shared opening forces prefix-cache hits.
    return LLM(STORIES, attention_backend="triton", max_num_batched_tokens=16, max_num_seqs=4)


def _check_greedy(llm: LLM, prompts: list[str], max_tokens: int) -> None:
    tok = llm.get_tokenizer()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        want = hf_greedy(STORIES, tok.encode(prompt), max_tokens, STORIES_EOS)
        assert out.outputs[0].token_ids == want, prompt
    assert_no_leak(llm.llm_engine)


def test_triton_backend_greedy_equals_transformers(triton_llm: LLM) -> None:
    _check_greedy(triton_llm, PROMPTS, 12)
    # Again with a long shared prefix: the second pass reads its prompt from the prefix cache.
    long = "Once upon a time, there was a little girl named Lily. She loved to play outside"
    _check_greedy(triton_llm, [long + " with her ball", long + " in the sun"], 8)
    assert triton_llm.llm_engine.get_stats().prefix_cache_hits > 0


def test_padded_decode_graph_path_gives_the_same_tokens(triton_llm: LLM) -> None:
    runner = triton_llm.llm_engine.engine_core.model_runner
    runner.capture_cuda_graphs(use_graphs=False)  # the replay path, run eagerly over padded buffers
    calls = []
    original = runner.graph_runner.run
    runner.graph_runner.run = lambda *a: calls.append(a[2].num_tokens) or original(*a)
    try:
        _check_greedy(triton_llm, PROMPTS, 10)  # 3 decodes per step pad to the bucket of 4
    finally:
        runner.graph_runner = None
    assert calls and 3 in calls
