"""The hybrid KV cache through the whole engine: a tiny Gemma 3 (two sliding layers of window 5
around a global one, so three KV cache groups) against transformers, with sliding groups giving
blocks back during chunked prefill and decode, prefix hits, preemption, and the Triton backend;
the same engine with --disable-hybrid-kv-cache-manager computes the same tokens in one group."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from api_helpers import assert_no_leak
from conftest import hf_greedy
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams

MAX_LEN = 96
MAX_TOKENS = 16
NO_EOS = [512]
PROMPT_LENS = (9, 23, 31, 40)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_hf_model_dir(tmp_path_factory.mktemp("hybrid"), "gemma3")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random("hybrid")
    return [[rng.randrange(3, 512) for _ in range(n)] for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def expected(gemma3: str, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(gemma3, p, MAX_TOKENS, NO_EOS) for p in prompts]


def _generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _sliding_blocks_held(llm: LLM) -> list[int]:
    """Per running request: the real (not null) blocks its sliding groups hold."""
    kv = llm.llm_engine.engine_core.scheduler.kv_cache_manager
    null = kv.pool.null_block
    sliding = [g for g, w in enumerate(llm.llm_engine.engine_core.config.cache_config.group_windows) if w]
    return [
        sum(1 for g in sliding for b in kv.groups[g].req_blocks.get(r.request_id, []) if b is not null)
        for r in llm.llm_engine.engine_core.scheduler.running
    ]


def test_sliding_groups_keep_only_the_window_and_match_transformers(
    gemma3: str, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    llm = LLM(gemma3, max_num_seqs=4, max_model_len=MAX_LEN, block_size=4, max_num_batched_tokens=8)
    config = llm.llm_engine.engine_core.config.cache_config
    assert config.group_windows == (5, 5, None)  # two sliding layers, one global: three groups of one
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, params)
    results: dict[str, list[int]] = {}
    most_held = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        most_held = max([most_held, *_sliding_blocks_held(llm)])
    # Window 5 over blocks of 4, chunks of up to 8 tokens: at most 4 blocks per sliding group.
    assert 0 < most_held <= 2 * 4
    assert [results[str(i)] for i in range(len(prompts))] == expected
    assert_no_leak(engine)


def test_prefix_hits_and_preemption_keep_outputs(
    gemma3: str, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    # 40 blocks: the four requests cannot all hold their full-attention context at once.
    llm = LLM(
        gemma3,
        max_num_seqs=4,
        max_model_len=MAX_LEN,
        block_size=4,
        max_num_batched_tokens=8,
        num_gpu_blocks_override=40,
    )
    assert _generate(llm, prompts) == expected
    assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0
    single = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for _ in range(2):  # the second run finds the first one's blocks (the batch's may be evicted)
        again = llm.generate({"prompt_token_ids": prompts[3]}, single, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 36 and again.outputs[0].token_ids == expected[3]
    assert_no_leak(llm.llm_engine)


@pytest.mark.parametrize("setting", [dict(attention_backend="triton"), dict(disable_hybrid_kv_cache_manager=True)])
def test_triton_backend_and_the_unified_cache_compute_the_same(
    gemma3: str, prompts: list[list[int]], expected: list[list[int]], setting: dict[str, object]
) -> None:
    llm = LLM(gemma3, max_num_seqs=4, max_model_len=MAX_LEN, block_size=4, max_num_batched_tokens=16, **setting)
    hybrid = not setting.get("disable_hybrid_kv_cache_manager")
    assert len(llm.llm_engine.engine_core.config.cache_config.group_windows) == (3 if hybrid else 1)
    assert _generate(llm, prompts[:2]) == expected[:2]
    assert_no_leak(llm.llm_engine)


def test_a_bad_window_fails_at_start_and_a_wide_one_is_full_attention(gemma3: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(gemma3, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "sliding_window": -4}))
    with pytest.raises(ValueError, match=f"{bad}: sliding_window must be a positive number of tokens, got -4"):
        LLM(str(bad), max_model_len=MAX_LEN)
    wide = tmp_path / "wide"
    shutil.copytree(gemma3, wide)
    (wide / "config.json").write_text(json.dumps({**config, "sliding_window": 4 * MAX_LEN}))
    llm = LLM(str(wide), max_model_len=MAX_LEN, max_num_seqs=2)
    assert llm.llm_engine.engine_core.config.cache_config.group_windows == (None,)


def test_mistral_slides_in_one_group_through_preemption_and_prefix_hits(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[list[int]]
) -> None:
    """Every layer with window 8: one sliding group, the null block behind the window. A request holds
    at most 5 blocks of 4 (window and chunk), so 11 blocks hold two of the four at once."""
    path = make_hf_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")
    expected = [hf_greedy(path, p, MAX_TOKENS, NO_EOS) for p in prompts]
    llm = LLM(
        path, max_num_seqs=4, max_model_len=MAX_LEN, block_size=4, max_num_batched_tokens=8, num_gpu_blocks_override=12
    )
    assert llm.llm_engine.engine_core.config.cache_config.group_windows == (8,)
    assert _generate(llm, prompts) == expected
    assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0
    again = llm.generate(
        {"prompt_token_ids": prompts[3]},
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert again.outputs[0].token_ids == expected[3]
    assert_no_leak(llm.llm_engine)
