"""The GPU-side code paths that can be checked without a GPU: defaults on CUDA, CUDA-graph
buckets and padding (replayed eagerly), split-K choice, and KV-cache sizing from a memory profile."""

from __future__ import annotations

import types

import pytest
import torch
from conftest import STORIES
from transformers import LlamaConfig

from tram import LLM
from tram.config import resolve_dtype
from tram.model.attention import default_attention_backend
from tram.model.attention.triton_backend import MAX_SPLITS, choose_num_splits
from tram.worker.cuda_graph import capture_sizes
from tram.worker.memory_profiler import MemoryProfile, dummy_prefill_meta, run_dummy_step
from tram.worker.worker import determine_num_blocks


def test_cuda_defaults_are_bfloat16_and_triton() -> None:
    cfg = LlamaConfig(torch_dtype="float32")
    assert resolve_dtype("auto", cfg, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float32", cfg, torch.device("cuda")) == torch.float32
    assert resolve_dtype("auto", LlamaConfig(torch_dtype="float16"), torch.device("cuda")) == torch.float16
    assert resolve_dtype("auto", cfg, torch.device("cpu")) == torch.float32
    assert default_attention_backend("cuda") == "triton" and default_attention_backend("cpu") == "torch"


def test_capture_sizes_cover_every_batch() -> None:
    for max_batch in (1, 3, 8, 20, 256):
        sizes = capture_sizes(max_batch)
        assert sizes[0] == 1 and sizes[-1] == max_batch and sizes == sorted(set(sizes))
        assert all(any(s >= b for s in sizes) for b in range(1, max_batch + 1))
    assert capture_sizes(256)[:5] == [1, 2, 4, 8, 16]


def test_num_splits_only_for_long_decodes_at_small_batch() -> None:
    assert choose_num_splits(1, 8, max_query_len=5, max_seq_len=4096) == 1  # prefill in the step
    assert choose_num_splits(1, 8, 1, 128) == 1  # too short to share out
    assert 1 < choose_num_splits(1, 8, 1, 4096) <= MAX_SPLITS
    assert choose_num_splits(256, 8, 1, 4096) == 1  # enough (request, head) programs already
    assert choose_num_splits(1, 8, 1, 4096) >= choose_num_splits(16, 8, 1, 4096)


def test_dummy_prefill_meta_spans_sequences_of_max_model_len() -> None:
    meta, blocks = dummy_prefill_meta(1100, 512, 16, torch.device("cpu"))
    assert meta.query_lens_list == [512, 512, 76] and meta.num_tokens == 1100
    assert blocks == 32 + 32 + 5
    slots = meta.slot_mapping.tolist()
    assert len(set(slots)) == 1100 and max(slots) < blocks * 16  # every token its own slot


def test_dummy_step_runs_at_the_token_budget() -> None:
    llm = LLM(STORIES, max_num_batched_tokens=1100, max_num_seqs=8)
    runner = llm.llm_engine.engine_core.model_runner
    temp_bytes = run_dummy_step(runner, 1100, 8)  # 3 sequences; must not touch the real cache
    assert temp_bytes == (32 + 32 + 5) * runner.bytes_per_block()
    assert all(not c.any() for c in runner.kv_caches)


def _fake_cuda_config(util: float, **overrides: object) -> types.SimpleNamespace:
    mc = types.SimpleNamespace(device=torch.device("cuda"))
    sc = types.SimpleNamespace(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=4096)
    base = dict(
        num_gpu_blocks_override=None,
        kv_cache_memory_bytes=None,
        gpu_memory_utilization=util,
        model_config=mc,
        scheduler_config=sc,
        cache_config=types.SimpleNamespace(block_size=16),
    )
    return types.SimpleNamespace(**{**base, **overrides})


class _FakeRunner:
    def __init__(self, profile: MemoryProfile) -> None:
        self.profile = profile

    def bytes_per_block(self) -> int:
        return 1 << 20

    def profile_memory(self) -> MemoryProfile:
        return self.profile


def test_kv_cache_gets_utilization_minus_weights_and_peak() -> None:
    gib = 1 << 30
    profile = MemoryProfile(total=80 * gib, weights=16 * gib, peak_activations=2 * gib, non_torch=1 * gib)
    blocks = determine_num_blocks(_fake_cuda_config(0.9), _FakeRunner(profile))
    assert blocks == (int(0.9 * 80 * gib) - 19 * gib) // (1 << 20)


def test_out_of_memory_start_names_the_knobs() -> None:
    gib = 1 << 30
    profile = MemoryProfile(total=24 * gib, weights=16 * gib, peak_activations=6 * gib, non_torch=1 * gib)
    with pytest.raises(ValueError, match="gpu_memory_utilization.*max_num_batched_tokens"):
        determine_num_blocks(_fake_cuda_config(0.9), _FakeRunner(profile))
