"""The whole engine on the Triton backend, run by Triton's interpreter on CPU (conftest sets
TRITON_INTERPRET=1): greedy tokens must equal transformers', with chunked prefill, prefix caching
and the padded CUDA-graph decode path.

The model is a random one-layer Llama with grouped KV heads (the stories260K tokenizer): the
interpreter runs every kernel program in Python, so each layer costs seconds per step, and one
layer takes the same paths as five. stories260K itself runs on the other backends."""

from __future__ import annotations

import pytest
from conftest import assert_no_leak, hf_greedy, hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams

PROMPTS = ["Once upon a time", "Tom and his dog went to the park. They", "The sun"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Four query heads over two KV heads, as stories260K's eight over four.
    return make_hf_model_dir(tmp_path_factory.mktemp("triton_e2e"), "llama_gqa", num_hidden_layers=1)


@pytest.fixture(scope="module")
def triton_llm(model_dir: str) -> LLM:
    # A small token budget forces chunked prefill; the shared opening forces prefix-cache hits.
    # float32 as the oracle (on CUDA a float32 checkpoint would otherwise run in bfloat16); on a GPU
    # a small share of its memory, or this tiny model gets tens of millions of cache blocks.
    return LLM(
        model_dir,
        attention_backend="triton",
        dtype="float32",
        gpu_memory_utilization=0.05,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )


def _check_greedy(llm: LLM, model: str, prompts: list[str], max_tokens: int) -> None:
    """Greedy tokens equal transformers', and so do their logprobs (a small error in attention shows
    there before it flips a token)."""
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        comp = out.outputs[0]
        assert comp.token_ids == hf_greedy(model, ids, max_tokens, None), prompt
        ref = hf_logprobs(model, ids + comp.token_ids)
        for i, token in enumerate(comp.token_ids):
            assert comp.logprobs[i][token].logprob == pytest.approx(ref[len(ids) - 1 + i, token].item(), abs=1e-4)
    assert_no_leak(llm.llm_engine)


def test_triton_backend_greedy_equals_transformers(triton_llm: LLM, model_dir: str) -> None:
    _check_greedy(triton_llm, model_dir, PROMPTS, 12)
    # Again with a long shared prefix: the second pass reads its prompt from the prefix cache.
    long = "Once upon a time, there was a little girl named Lily. She loved to play outside"
    _check_greedy(triton_llm, model_dir, [long + " with her ball", long + " in the sun"], 8)
    assert triton_llm.llm_engine.get_stats().prefix_cache_hits > 0


def test_padded_decode_graph_path_gives_the_same_tokens(triton_llm: LLM, model_dir: str) -> None:
    runner = triton_llm.llm_engine.engine_core.model_runner
    runner.capture_cuda_graphs(use_graphs=False)  # the replay path, run eagerly over padded buffers
    calls = []
    original = runner.graph_runner.run
    runner.graph_runner.run = lambda *a: calls.append(a[2].num_tokens) or original(*a)
    try:
        _check_greedy(triton_llm, model_dir, PROMPTS, 10)  # 3 decodes per step pad to the bucket of 4
    finally:
        runner.graph_runner = None
    assert calls and 3 in calls
