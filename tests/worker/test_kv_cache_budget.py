"""The CPU KV cache sized to the model: what the requests can use, capped by a budget (the flag, then
TRAM_CPU_KVCACHE_SPACE, then vLLM's VLLM_CPU_KVCACHE_SPACE), a budget the machine cannot hold refused at
start, and memory taken only as blocks are written."""

from __future__ import annotations

import pytest
from api_helpers import assert_no_leak

from tram import LLM, SamplingParams
from tram.config import EngineConfig
from tram.core.block_pool import BlockPool
from tram.worker.cpu_memory import mem_available
from tram.worker.kv_cache import cpu_kv_cache_budget


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.fixture
def no_env_budget(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("TRAM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    return monkeypatch


def test_the_budget_comes_from_the_flag_then_tram_then_vllm(no_env_budget: pytest.MonkeyPatch) -> None:
    config = EngineConfig.__new__(EngineConfig)
    config.kv_cache_memory_bytes = None
    assert cpu_kv_cache_budget(config) == (4 << 30, "the default", False)
    no_env_budget.setenv("VLLM_CPU_KVCACHE_SPACE", "0")  # vLLM's "unset"
    assert cpu_kv_cache_budget(config)[1] == "the default"
    no_env_budget.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert cpu_kv_cache_budget(config) == (2 << 30, "VLLM_CPU_KVCACHE_SPACE=2", True)
    no_env_budget.setenv("TRAM_CPU_KVCACHE_SPACE", "0.5")
    assert cpu_kv_cache_budget(config) == (1 << 29, "TRAM_CPU_KVCACHE_SPACE=0.5", True)
    config.kv_cache_memory_bytes = 1 << 20
    assert cpu_kv_cache_budget(config) == (1 << 20, "kv_cache_memory_bytes", True)


def test_the_default_holds_what_the_requests_can_use(stories_path: str, no_env_budget: pytest.MonkeyPatch) -> None:
    llm = LLM(stories_path, max_num_seqs=3, max_model_len=64, block_size=16)
    assert llm.llm_engine.engine_core.config.cache_config.num_blocks == 3 * 4  # 3 requests of 4 blocks
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=8), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8
    assert_no_leak(llm.llm_engine)


def test_a_budget_beyond_the_machine_fails_at_start(stories_path: str, no_env_budget: pytest.MonkeyPatch) -> None:
    available = mem_available()
    assert available is not None
    no_env_budget.setenv("TRAM_CPU_KVCACHE_SPACE", str(2 * available / 2**30))
    with pytest.raises(ValueError, match=r"TRAM_CPU_KVCACHE_SPACE=.* is more than the .* GiB of memory"):
        LLM(stories_path, max_model_len=64)


def test_the_cache_takes_memory_only_as_blocks_are_written(
    stories_path: str, no_env_budget: pytest.MonkeyPatch
) -> None:
    """A 2 GiB cache of which a few requests write a few blocks: the process grows by far less."""
    before = _rss()
    llm = LLM(stories_path, max_model_len=256, kv_cache_memory_bytes=2 << 30)
    caches = llm.llm_engine.engine_core.model_runner.kv_caches
    assert sum(c.numel() * c.element_size() for c in caches) > (2 << 30) - (1 << 20)
    llm.generate(["Once upon a time"] * 4, SamplingParams(max_tokens=16), use_tqdm=False)
    assert _rss() - before < 256 << 20
    assert_no_leak(llm.llm_engine)


def test_blocks_without_a_hash_are_handed_out_again_first() -> None:
    pool = BlockPool(8, enable_caching=True)
    first = pool.get_new_blocks(3)
    pool.cache_block(first[0], 1234)
    pool.free_blocks(first)
    again = pool.get_new_blocks(2)
    # The two plain blocks come back first (their pages are mapped); the cached one waits at the tail.
    assert {b.block_id for b in again} == {first[1].block_id, first[2].block_id}
    assert pool.get_cached_block(1234) is first[0]
