"""Qwen3 and Gemma 3 through the whole engine (tram.LLM) against transformers on the same weights:
greedy tokens identical, under chunked prefill, with prefix-cache hits and with staggered arrivals,
and sampled-token logprobs within float tolerance. Gemma 3's sliding window (5) is far shorter than
the prompts plus generations, so its sliding and global layers both matter."""

from __future__ import annotations

import random

import pytest
from api_helpers import assert_no_leak, run_staggered
from conftest import hf_greedy, hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams

KINDS = ["qwen3", "gemma3"]
MAX_TOKENS = 20
NO_EOS = [512]  # an id outside the 512-token vocabulary: transformers then stops on length only, like ignore_eos
MAX_LEN = 128


def _prompts(seed: str, count: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(6, 40))] for _ in range(count)]


def _greedy(max_tokens: int = MAX_TOKENS, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)


def _token_ids(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("new_families")
    return {kind: make_hf_model_dir(tmp, kind) for kind in [*KINDS, "gemma3_softcap"]}


@pytest.mark.parametrize("kind", [*KINDS, "gemma3_softcap"])
def test_greedy_and_logprobs_match_transformers(kind: str, model_dirs: dict[str, str]) -> None:
    path = model_dirs[kind]
    prompts = _prompts(kind)
    llm = LLM(path, max_num_seqs=8, max_model_len=MAX_LEN)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], _greedy(logprobs=2), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        comp = out.outputs[0]
        assert comp.token_ids == hf_greedy(path, prompt, MAX_TOKENS, NO_EOS), f"{kind}: {prompt}"
        ref = hf_logprobs(path, prompt + comp.token_ids)  # [len, vocab]
        for i, tok in enumerate(comp.token_ids):
            row = ref[len(prompt) - 1 + i]
            scale = max(1.0, row.abs().max().item())
            assert comp.logprobs[i][tok].logprob == pytest.approx(row[tok].item(), abs=2e-4 * scale)
    assert_no_leak(llm.llm_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_keeps_greedy_output(kind: str, model_dirs: dict[str, str]) -> None:
    """A budget of 8 tokens a step: every prompt is prefilled in chunks, beside other requests' decodes."""
    path = model_dirs[kind]
    prompts = _prompts(kind + "-chunked")
    llm = LLM(path, max_num_seqs=8, max_model_len=MAX_LEN, max_num_batched_tokens=8, block_size=4)
    for prompt, tokens in zip(prompts, _token_ids(llm, prompts, _greedy())):
        assert tokens == hf_greedy(path, prompt, MAX_TOKENS, NO_EOS), f"{kind}: {prompt}"
    assert_no_leak(llm.llm_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_prefix_cache_hits_keep_greedy_output(kind: str, model_dirs: dict[str, str]) -> None:
    """Prompts sharing a 30-token prefix: later ones reuse its three full 8-token blocks."""
    path = model_dirs[kind]
    rng = random.Random(kind + "-prefix")
    prefix = [rng.randrange(3, 512) for _ in range(30)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(n)] for n in (3, 9, 1)]
    llm = LLM(path, max_num_seqs=8, max_model_len=MAX_LEN, block_size=8)
    first = llm.generate({"prompt_token_ids": prompts[0]}, _greedy(), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    later = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], _greedy(), use_tqdm=False)
    assert [o.num_cached_tokens for o in later] == [24, 24]
    for prompt, out in zip(prompts, [first, *later]):
        assert out.outputs[0].token_ids == hf_greedy(path, prompt, MAX_TOKENS, NO_EOS), f"{kind}: {prompt}"
    assert_no_leak(llm.llm_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_staggered_arrivals_match_each_request_alone(kind: str, model_dirs: dict[str, str]) -> None:
    """Requests joining a running batch every 3 steps, under a small budget, get the tokens they get alone."""
    path = model_dirs[kind]
    prompts = _prompts(kind + "-stagger", count=5)
    params = [_greedy(max_tokens=12 + 3 * i) for i in range(len(prompts))]
    llm = LLM(path, max_num_seqs=8, max_model_len=MAX_LEN, max_num_batched_tokens=16, block_size=4)
    alone = [_token_ids(llm, [p], sp)[0] for p, sp in zip(prompts, params)]
    assert alone[0] == hf_greedy(path, prompts[0], params[0].max_tokens, NO_EOS)
    # A fresh engine, so that no prompt is served from the prefix cache the solo runs filled.
    batched = LLM(path, max_num_seqs=8, max_model_len=MAX_LEN, max_num_batched_tokens=16, block_size=4)
    assert run_staggered(batched.llm_engine, prompts, params, every=3) == alone
    assert_no_leak(llm.llm_engine)
