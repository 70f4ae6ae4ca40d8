"""Gemma 2 through the whole engine (tram.LLM) against transformers on the same random weights:
greedy tokens identical and sampled-token logprobs within float tolerance, under chunked prefill,
prefix-cache hits, preemption, the Triton backend (run by Triton's interpreter) and tensor
parallelism 2.

The tiny model ("gemma2" in hf_models.KINDS) alternates sliding layers of window 5, far shorter than
the prompts, with a global one, and its attention soft-cap (10) is below its largest scores (about
30), so tanh bends them: with the cap left out, the engine gets other tokens for most prompts. One
LLM per configuration, shared by its module's tests."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from api_helpers import assert_no_leak
from conftest import hf_greedy, hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, RequestOutput, SamplingParams
from tram.model.spec import layer_sliding_windows

MAX_TOKENS = 16
NO_EOS = [512]  # an id outside the 512-token vocabulary: transformers then stops on length only, like ignore_eos
MAX_LEN = 128
WINDOW = 5


def _prompts(seed: str, count: int = 3, shortest: int = 8, longest: int = 40) -> list[list[int]]:
    """Prompts longer than the window, none shared with another test (so no prefix-cache hits)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(shortest, longest))] for _ in range(count)]


def _greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)


def check_against_transformers(
    llm: LLM, path: str, prompts: list[list[int]], max_tokens: int = MAX_TOKENS
) -> list[RequestOutput]:
    """Generate greedily; tokens must equal transformers' and their logprobs match its own; the KV
    cache is clean afterwards."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], _greedy(max_tokens), use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        comp = out.outputs[0]
        assert comp.token_ids == hf_greedy(path, prompt, max_tokens, NO_EOS), prompt
        ref = hf_logprobs(path, prompt + comp.token_ids)  # [len, vocab]
        for i, tok in enumerate(comp.token_ids):
            row = ref[len(prompt) - 1 + i]
            scale = max(1.0, row.abs().max().item())
            assert comp.logprobs[i][tok].logprob == pytest.approx(row[tok].item(), abs=2e-4 * scale)
    assert_no_leak(llm.llm_engine)
    return outs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_hf_model_dir(tmp_path_factory.mktemp("gemma2"), "gemma2", sliding_window=WINDOW)


@pytest.fixture(scope="module")
def llm(model_dir: str) -> LLM:
    return LLM(model_dir, max_num_seqs=8, max_model_len=MAX_LEN, block_size=8)


def test_config_is_what_the_tests_rely_on(model_dir: str) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    assert config.architectures == ["Gemma2ForCausalLM"]
    assert config.sliding_window == WINDOW and "full_attention" in config.layer_types
    assert config.attn_logit_softcapping and config.final_logit_softcapping
    assert min(len(p) for p in _prompts("any")) > WINDOW


def test_configs_without_layer_types_slide_on_even_layers() -> None:
    """A Gemma 2 config of transformers < 4.53 lists no layer_types; its layers are the ones today's
    Gemma2Config lists by default (the even ones slide)."""
    from transformers import Gemma2Config

    old = SimpleNamespace(model_type="gemma2", num_hidden_layers=5, sliding_window=8)
    assert layer_sliding_windows(old) == (8, None, 8, None, 8)
    assert layer_sliding_windows(old) == layer_sliding_windows(Gemma2Config(num_hidden_layers=5, sliding_window=8))


def test_greedy_and_logprobs_match_transformers(llm: LLM, model_dir: str) -> None:
    check_against_transformers(llm, model_dir, _prompts("plain", count=4))


def test_prefix_cache_hits_keep_output(llm: LLM, model_dir: str) -> None:
    """Prompts sharing a 30-token prefix: later ones read its full 8-token blocks from the cache."""
    rng = random.Random("prefix")
    prefix = [rng.randrange(3, 512) for _ in range(30)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(n)] for n in (3, 9, 1)]
    first = check_against_transformers(llm, model_dir, prompts[:1])[0]
    assert first.num_cached_tokens == 0
    later = check_against_transformers(llm, model_dir, prompts[1:])
    assert all(out.num_cached_tokens > 0 for out in later)


def test_chunked_prefill_keeps_output(model_dir: str) -> None:
    """A budget of 8 tokens a step: every prompt is prefilled in chunks over the cache the earlier
    chunks filled, beside other requests' decodes."""
    llm = LLM(model_dir, max_num_seqs=8, max_model_len=MAX_LEN, max_num_batched_tokens=8, block_size=4)
    check_against_transformers(llm, model_dir, _prompts("chunked", count=4))


def test_preemption_keeps_output(model_dir: str) -> None:
    """32 blocks of 4 tokens for 4 requests of up to ~50 tokens (12 blocks each for the global layer
    alone): requests are preempted and recomputed."""
    llm = LLM(
        model_dir,
        max_num_seqs=4,
        max_model_len=64,
        max_num_batched_tokens=8,
        block_size=4,
        num_gpu_blocks_override=32,
        enable_prefix_caching=False,
    )
    check_against_transformers(llm, model_dir, _prompts("preempt", count=4, shortest=20, longest=34))
    assert llm.llm_engine.get_stats().num_preemptions > 0


def test_triton_backend(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The Triton kernels (soft-capped, windowed) under Triton's interpreter; two layers (a sliding
    and a global one) since the interpreter runs every program in Python. A 16-token budget chunks
    the longer prompts; the shared opening of the second round is read from the prefix cache."""
    path = make_hf_model_dir(
        tmp_path_factory.mktemp("gemma2_triton"),
        "gemma2",
        sliding_window=WINDOW,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
    )
    llm = LLM(path, attention_backend="triton", max_num_batched_tokens=16, max_num_seqs=4, block_size=16)
    check_against_transformers(llm, path, _prompts("triton", count=2, longest=24), max_tokens=8)
    opening = _prompts("triton-prefix", count=1, shortest=20, longest=21)[0]
    check_against_transformers(llm, path, [opening + [7, 8, 9], opening + [10, 11]], max_tokens=6)
    assert llm.llm_engine.get_stats().prefix_cache_hits > 0


@pytest.fixture(scope="module")
def tp_llm(model_dir: str) -> Iterator[LLM]:
    llm = LLM(model_dir, tensor_parallel_size=2, max_num_seqs=8, max_model_len=MAX_LEN, max_num_batched_tokens=16)
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_tensor_parallel_2(tp_llm: LLM, model_dir: str) -> None:
    """Two ranks, one KV head each; a 16-token budget chunks the longer prompts."""
    check_against_transformers(tp_llm, model_dir, _prompts("tp", count=3))
