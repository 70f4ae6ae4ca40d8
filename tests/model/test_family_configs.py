"""How Qwen3, Gemma 2 and Gemma 3 read their configs: attention_bias, old and new RoPE styles, settings that
Tram refuses, and one cos/sin computation per RoPE and step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hf_models import PagedRunner, hf_logits, make_hf_model_dir

from tram.config import ModelConfig
from tram.model.layers.rope import RotaryEmbedding, rope_parameters
from tram.model.loader import get_hf_config, load_model

TOKENS = [1, 37, 250, 12, 99, 401, 7, 7, 300, 45, 88, 123, 511, 2, 64, 65, 66, 200]


def _load(path: str) -> torch.nn.Module:
    return load_model(
        ModelConfig(
            model=path,
            hf_config=get_hf_config(path),
            dtype=torch.float32,
            device=torch.device("cpu"),
            max_model_len=512,
        )
    )


def _prefill_logits(path: str, tokens: list[int] = TOKENS) -> torch.Tensor:
    (logits,) = PagedRunner(_load(path), get_hf_config(path), block_size=4).step([("a", tokens)])
    return logits


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, atol=1e-4 * ref.abs().max().item(), rtol=0)


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_hf_model_dir(tmp_path_factory.mktemp("gemma3_cfg"), "gemma3")


def test_qwen3_follows_attention_bias(tmp_path: Path) -> None:
    path = make_hf_model_dir(tmp_path, "qwen3", attention_bias=True)
    model = _load(path)
    names = {name for name, _ in model.named_parameters()}
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.o_proj.bias"} <= names
    assert "model.layers.0.self_attn.q_norm.weight" in names
    _assert_close(_prefill_logits(path), hf_logits(path, TOKENS))


def test_gemma3_old_style_rope_config_matches_transformers(gemma3_dir: str, tmp_path: Path) -> None:
    """A config.json written before transformers 5: rope_theta / rope_scaling for global layers,
    rope_local_base_freq for sliding ones. Same weights and RoPEs as the gemma3 kind."""
    folder = tmp_path / "gemma3_old_style"
    shutil.copytree(gemma3_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    ropes = config.pop("rope_parameters")
    config.update(
        rope_theta=ropes["full_attention"]["rope_theta"],
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rope_local_base_freq=ropes["sliding_attention"]["rope_theta"],
    )
    (folder / "config.json").write_text(json.dumps(config))
    ours = _prefill_logits(str(folder))
    _assert_close(ours, hf_logits(str(folder), TOKENS))
    _assert_close(ours, hf_logits(gemma3_dir, TOKENS))


def test_rope_parameters_per_layer_type_in_both_styles() -> None:
    new = SimpleNamespace(
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
    )
    assert rope_parameters(new, "full_attention") == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert rope_parameters(new, "sliding_attention") == {"rope_type": "default", "rope_theta": 1e4}
    old = SimpleNamespace(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert rope_parameters(old, "sliding_attention") == {"rope_type": "default", "rope_theta": 1e4}
    assert rope_parameters(old, "full_attention") == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="no entry for layer type 'chunked_attention'"):
        rope_parameters(new, "chunked_attention")


def test_gemma3_serves_attn_logit_softcapping_as_transformers(tmp_path: Path, gemma3_dir: str) -> None:
    """A Gemma 3 config with attn_logit_softcapping loads and matches transformers, whose Gemma 3
    reads the setting but never applies it (Gemma 2 does): the same logits as without it."""
    path = make_hf_model_dir(tmp_path, "gemma3", attn_logit_softcapping=5.0)
    ours = _prefill_logits(path)
    _assert_close(ours, hf_logits(path, TOKENS))
    torch.testing.assert_close(ours, _prefill_logits(gemma3_dir), atol=0, rtol=0)


@pytest.mark.parametrize(
    "setting,value",
    [("use_bidirectional_attention", True), ("attn_logit_softcapping", 0.0), ("final_logit_softcapping", -30.0)],
)
def test_gemma3_rejects_what_the_kernels_cannot_compute(gemma3_dir: str, setting: str, value: object) -> None:
    config = ModelConfig(
        model=gemma3_dir,
        hf_config=get_hf_config(gemma3_dir),
        dtype=torch.float32,
        device=torch.device("cpu"),
        max_model_len=512,
    )
    setattr(config.hf_config, setting, value)
    with pytest.raises(ValueError, match=setting):
        load_model(config)


def test_gemma3_computes_each_rope_once_per_step(gemma3_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kinds of layer (three layers): two cos/sin lookups per forward, not one per layer."""
    model = _load(gemma3_dir)
    calls: list[int] = []
    original = RotaryEmbedding.cos_sin

    def counting(self: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
        calls.append(id(self))
        return original(self, positions, dtype)

    monkeypatch.setattr(RotaryEmbedding, "cos_sin", counting)
    PagedRunner(model, get_hf_config(gemma3_dir), block_size=4).step([("a", TOKENS)])
    assert len(calls) == 2 and len(set(calls)) == 2


def test_gemma2_layer_types_share_one_rope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 2's sliding and global layers have one RoPE: one table, one cos/sin lookup per forward."""
    path = make_hf_model_dir(tmp_path, "gemma2")
    model = _load(path)
    assert len(model.model.rotary_emb.ropes) == 1
    calls: list[int] = []
    original = RotaryEmbedding.cos_sin

    def counting(self: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
        calls.append(id(self))
        return original(self, positions, dtype)

    monkeypatch.setattr(RotaryEmbedding, "cos_sin", counting)
    (logits,) = PagedRunner(model, get_hf_config(path), block_size=4).step([("a", TOKENS)])
    assert len(calls) == 1
    _assert_close(logits, hf_logits(path, TOKENS))
