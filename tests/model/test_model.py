"""The model layer against transformers: full prefill, chunked prefill + decode through the paged
cache, mixed batches, loading (safetensors single/sharded, bfloat16, dummy) and error paths."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hf_models import KINDS, STORIES_DIR, PagedRunner, StepRequest, build_meta, hf_logits, make_hf_model_dir

from tram.config import ModelConfig
from tram.model.attention import get_attention_backend
from tram.model.layers.rope import rope_parameters
from tram.model.loader import get_hf_config, load_model
from tram.model.registry import get_model_class

ALL_KINDS = [*KINDS, "stories260K", "qwen2_window"]
# Qwen2 with sliding windows on some layers only (layers >= max_window_layers), shorter than the prompts.
_QWEN2_WINDOW = dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)
# A fixed token sequence: 20 prompt tokens, then 8 "generated" ones fed back one at a time.
TOKENS = [
    1,
    37,
    250,
    12,
    99,
    401,
    7,
    7,
    300,
    45,
    88,
    123,
    511,
    2,
    64,
    65,
    66,
    200,
    150,
    17,
    42,
    9,
    310,
    77,
    8,
    480,
    33,
    5,
]
PROMPT_LEN = 20


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("hf_models")
    dirs = {kind: make_hf_model_dir(tmp, kind) for kind in KINDS}
    dirs["stories260K"] = STORIES_DIR
    dirs["qwen2_window"] = make_hf_model_dir(tmp / "window", "qwen2", **_QWEN2_WINDOW)
    return dirs


@pytest.fixture(scope="module")
def references(model_dirs: dict[str, str]) -> dict[str, torch.Tensor]:
    """transformers' logits for TOKENS, per kind (computed once: the oracle for every test here)."""
    return {kind: hf_logits(path, TOKENS) for kind, path in model_dirs.items()}


def _config(path: str, dtype: torch.dtype = torch.float32, **kwargs) -> ModelConfig:
    return ModelConfig(
        model=path, hf_config=get_hf_config(path), dtype=dtype, device=torch.device("cpu"), max_model_len=512, **kwargs
    )


def _assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    scale = ref.abs().max().item()
    torch.testing.assert_close(ours, ref, atol=rel * scale, rtol=0)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_full_prefill_matches_transformers(
    kind: str, model_dirs: dict[str, str], references: dict[str, torch.Tensor]
) -> None:
    path = model_dirs[kind]
    model = load_model(_config(path))
    runner = PagedRunner(model, get_hf_config(path), block_size=16)
    (logits,) = runner.step([("a", TOKENS[:PROMPT_LEN])])
    assert logits.dtype == torch.float32
    _assert_logits_close(logits, references[kind][:PROMPT_LEN])


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_chunked_prefill_then_decode_matches_full_forward(
    kind: str, block_size: int, model_dirs: dict[str, str], references: dict[str, torch.Tensor]
) -> None:
    path = model_dirs[kind]
    model = load_model(_config(path))
    runner = PagedRunner(model, get_hf_config(path), block_size=block_size)
    ref = references[kind]
    pos = 0
    for chunk in (7, 6, 7):  # chunks straddle block boundaries for both block sizes
        (logits,) = runner.step([("a", TOKENS[pos : pos + chunk])])
        _assert_logits_close(logits, ref[pos : pos + chunk])
        pos += chunk
    for pos in range(PROMPT_LEN, len(TOKENS)):
        (logits,) = runner.step([("a", [TOKENS[pos]])])
        _assert_logits_close(logits, ref[pos : pos + 1])


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("kind", ["llama_gqa", "mistral", "qwen2_window", "stories260K", "qwen3", "gemma3"])
def test_mixed_batches_of_prefills_and_decodes(kind: str, block_size: int, model_dirs: dict[str, str]) -> None:
    """Three requests with different prompts share steps in every combination the scheduler makes."""
    path = model_dirs[kind]
    seqs = {"a": TOKENS, "b": TOKENS[::-1], "c": [t * 7 % 512 for t in TOKENS]}
    refs = {rid: hf_logits(path, seq) for rid, seq in seqs.items()}
    runner = PagedRunner(load_model(_config(path)), get_hf_config(path), block_size=block_size)
    done = dict.fromkeys(seqs, 0)

    def step(plan: list[tuple[str, int]]) -> None:
        chunks = [(rid, seqs[rid][done[rid] : done[rid] + n]) for rid, n in plan]
        for (rid, n), logits in zip(plan, runner.step(chunks)):
            _assert_logits_close(logits, refs[rid][done[rid] : done[rid] + n])
            done[rid] += n

    step([("a", 20), ("b", 11)])  # two fresh prefills in one batch
    step([("a", 1), ("c", 9), ("b", 9)])  # decode, fresh prefill, prefill with cached prefix
    step([("a", 1), ("c", 5), ("b", 1)])  # decodes not adjacent in the batch, chunk behind a prefix
    step([("c", 6), ("b", 1), ("a", 1)])  # prefill chunk first, then decodes
    for _ in range(5):
        step([("b", 1), ("c", 1), ("a", 1)])  # decode only, contexts of different lengths


def test_attention_backend_matches_naive_attention() -> None:
    """GQA + sliding window + a mixed batch against a per-token loop over contiguous K/V."""
    torch.manual_seed(0)
    heads, kv_heads, dim, block_size, window = 6, 2, 8, 4, 5
    backend = get_attention_backend("torch")
    lens = [(9, 1), (6, 4), (3, 3), (12, 1), (1, 1)]  # (context length, query length) per request
    cache = torch.randn(2, 24, block_size, kv_heads, dim)
    free = torch.randperm(24).tolist()
    reqs = [StepRequest([free.pop() for _ in range(-(-s // block_size))], s - q, q) for s, q in lens]
    full_k = [torch.randn(s, kv_heads, dim) for s, _ in lens]
    full_v = [torch.randn(s, kv_heads, dim) for s, _ in lens]
    for r, k, v in zip(reqs, full_k, full_v):  # the cached prefix, as earlier steps would have written it
        for p in range(r.num_computed):
            cache[0, r.block_table[p // block_size], p % block_size] = k[p]
            cache[1, r.block_table[p // block_size], p % block_size] = v[p]
    meta = build_meta(reqs, block_size)
    query = torch.randn(meta.num_tokens, heads, dim)
    key = torch.cat([k[r.num_computed :] for r, k in zip(reqs, full_k)])
    value = torch.cat([v[r.num_computed :] for r, v in zip(reqs, full_v)])
    for sliding_window in (None, window):
        out = backend.forward(query, key, value, cache.clone(), meta, 0.3, sliding_window)
        expected = _naive_attention(query, full_k, full_v, reqs, 0.3, sliding_window)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # Rows past the requests' tokens (batch padding, slot -1) must neither write the cache nor fail.
    unpadded_cache, padded_cache = cache.clone(), cache.clone()
    backend.forward(query, key, value, unpadded_cache, meta, 0.3)
    n = meta.num_tokens
    meta.slot_mapping = torch.cat((meta.slot_mapping, torch.tensor([-1, -1])))
    meta.num_tokens = n + 2
    pad_q, pad_kv = torch.randn(2, heads, dim), torch.randn(2, kv_heads, dim)
    out = backend.forward(
        torch.cat((query, pad_q)), torch.cat((key, pad_kv)), torch.cat((value, pad_kv)), padded_cache, meta, 0.3
    )
    torch.testing.assert_close(out[:n], _naive_attention(query, full_k, full_v, reqs, 0.3, None), atol=1e-5, rtol=1e-5)
    assert torch.equal(padded_cache, unpadded_cache)


def _naive_attention(
    query: torch.Tensor,
    full_k: list[torch.Tensor],
    full_v: list[torch.Tensor],
    reqs: list[StepRequest],
    scale: float,
    window: int | None,
) -> torch.Tensor:
    rows = []
    groups = query.shape[1] // full_k[0].shape[1]
    t = 0
    for r, k, v in zip(reqs, full_k, full_v):
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [S, H, D]
        for pos in range(r.num_computed, r.num_computed + r.query_len):
            lo = 0 if window is None else max(0, pos - window + 1)
            scores = torch.einsum("hd,shd->hs", query[t], k[lo : pos + 1]) * scale
            rows.append(torch.einsum("hs,shd->hd", scores.softmax(-1), v[lo : pos + 1]))
            t += 1
    return torch.stack(rows)


def test_bfloat16_load_is_close_to_float32(references: dict[str, torch.Tensor]) -> None:
    model = load_model(_config(STORIES_DIR, dtype=torch.bfloat16))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    runner = PagedRunner(model, get_hf_config(STORIES_DIR), block_size=16)
    (logits,) = runner.step([("a", TOKENS[:PROMPT_LEN])])
    ref = references["stories260K"][:PROMPT_LEN]
    assert logits.dtype == torch.float32
    _assert_logits_close(logits, ref, rel=0.05)
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_dummy_load_is_deterministic(model_dirs: dict[str, str]) -> None:
    path = model_dirs["llama_gqa"]
    first = load_model(_config(path, load_format="dummy", seed=3)).state_dict()
    second = load_model(_config(path, load_format="dummy", seed=3)).state_dict()
    other = load_model(_config(path, load_format="dummy", seed=4)).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(
        first["model.layers.0.self_attn.q_proj.weight"], other["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(first["model.norm.weight"], torch.ones(64))
    model = load_model(_config(path, load_format="dummy"))
    (logits,) = PagedRunner(model, get_hf_config(path), block_size=16).step([("a", TOKENS)])
    assert torch.isfinite(logits).all()


def test_sharded_checkpoint_loads_like_single_file(model_dirs: dict[str, str], tmp_path: Path) -> None:
    sharded = make_hf_model_dir(tmp_path, "llama_untied", max_shard_size="40KB")
    index = json.loads(Path(sharded, "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    single = load_model(_config(model_dirs["llama_untied"])).state_dict()
    split = load_model(_config(sharded)).state_dict()
    assert single.keys() == split.keys()
    assert all(torch.equal(single[k], split[k]) for k in single)


def test_unsupported_architecture_names_the_supported_ones(model_dirs: dict[str, str]) -> None:
    config = _config(model_dirs["llama_gqa"])
    config.hf_config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen2ForCausalLM"):
        load_model(config)
    with pytest.raises(ValueError, match="Supported architectures"):
        get_model_class("")


def test_mismatched_checkpoint_names_the_weights(model_dirs: dict[str, str], tmp_path: Path) -> None:
    """A Qwen2 checkpoint (q/k/v biases) declared as Llama: the error lists the unexpected biases."""
    folder = tmp_path / "qwen_as_llama"
    shutil.copytree(model_dirs["qwen2"], folder)
    config = _config(str(folder))
    config.hf_config.architectures = ["LlamaForCausalLM"]
    with pytest.raises(ValueError, match=r"unexpected weights .*self_attn\.[qkv]_proj\.bias"):
        load_model(config)
    os.remove(folder / "model.safetensors")
    with pytest.raises(ValueError, match="No safetensors weights"):
        load_model(_config(str(folder)))


def test_unknown_attention_backend_lists_supported() -> None:
    with pytest.raises(ValueError, match="Supported backends: torch"):
        get_attention_backend("flash")


def test_rope_parameters_accepts_old_and_new_config_styles() -> None:
    old = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    assert rope_parameters(old) == {"type": "linear", "factor": 2.0, "rope_type": "linear", "rope_theta": 5e5}
    new = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert rope_parameters(new)["rope_theta"] == 1e6
    assert rope_parameters(SimpleNamespace()) == {"rope_type": "default", "rope_theta": 10000.0}


def test_hub_ids_download_metadata_then_only_indexed_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from tram.model.loader import resolve_model_path

    sharded = make_hf_model_dir(tmp_path, "llama_gqa", max_shard_size="40KB")
    calls: list[list[str]] = []

    def fake_snapshot_download(repo_id: str, revision: str | None = None, allow_patterns=None, **_) -> str:
        assert (repo_id, revision) == ("org/tiny", "main")
        calls.append(list(allow_patterns))
        return sharded

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert resolve_model_path("org/tiny", "main") == sharded
    shards = sorted(set(json.loads(Path(sharded, "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert "*.json" in calls[0] and calls[1] == shards

    def offline(*args, **kwargs) -> str:
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="'org/tiny' is not a local folder.*no network"):
        resolve_model_path("org/tiny")
