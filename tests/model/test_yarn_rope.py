"""YaRN RoPE (rope_type "yarn": gpt-oss, Qwen3 with rope_scaling, DeepSeek-style mscale) computed by
Tram itself (tram/model/layers/rope.py), against transformers: the inverse frequencies and attention
factor bit for bit, cos/sin against the families' own rotary embeddings, the same from a worker's
config snapshot (no transformers there), and a Qwen3 model with YaRN through tram.LLM greedy-identical
to transformers on the same random weights."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_logprobs
from hf_models import make_hf_model_dir

from tram import LLM, SamplingParams
from tram.config.hf_snapshot import snapshot_hf_config
from tram.model.layers import rope as rope_module
from tram.model.layers.rope import RotaryEmbedding

# Qwen3 as its model card extends it to 128K.
QWEN3_128K = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
# Small enough that the ramp between kept and stretched frequencies falls inside a tiny head.
QWEN3_TINY = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1000.0}


def gpt_oss_config(**overrides):
    from transformers import GptOssConfig

    return GptOssConfig(**overrides)


def qwen3_config(rope_parameters: dict, **overrides):
    from transformers import Qwen3Config

    return Qwen3Config(rope_parameters=dict(rope_parameters), max_position_embeddings=131072, **overrides)


CONFIGS = {
    "gpt-oss": lambda: gpt_oss_config(),
    "qwen3-128k": lambda: qwen3_config(QWEN3_128K),
    "qwen3-tiny": lambda: qwen3_config(QWEN3_TINY, head_dim=32),
    "qwen3-truncate-false": lambda: qwen3_config({**QWEN3_TINY, "truncate": False}, head_dim=32),
    "qwen3-betas": lambda: qwen3_config({**QWEN3_TINY, "beta_fast": 8.0, "beta_slow": 2.0}, head_dim=32),
    "deepseek-mscale": lambda: qwen3_config({**QWEN3_TINY, "mscale": 0.707, "mscale_all_dim": 1.0}, head_dim=32),
    "attention-factor": lambda: qwen3_config({**QWEN3_TINY, "attention_factor": 0.9}, head_dim=32),
    "partial-rotary": lambda: qwen3_config({**QWEN3_TINY, "partial_rotary_factor": 0.5}, head_dim=32),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_inv_freq_and_attention_factor_are_transformers_own(name: str) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = CONFIGS[name]()
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    for source in (config, snapshot_hf_config(config)):  # the engine's config, a worker's snapshot
        freq, factor = rope_module._inv_freq_and_scaling(source, config.head_dim, None)
        assert torch.equal(freq, want_freq) and factor == want_factor, name


def test_yarn_needs_no_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker never imports transformers: YaRN is computed from the snapshot's values alone."""
    import sys

    snapshot = snapshot_hf_config(gpt_oss_config())
    monkeypatch.setitem(sys.modules, "transformers.modeling_rope_utils", None)  # any import of it now fails
    freq, factor = rope_module._inv_freq_and_scaling(snapshot, 64, None)
    assert freq.shape == (32,) and factor > 1


def test_the_ramp_mixes_kept_and_stretched_frequencies() -> None:
    """gpt-oss's (truncate false) and the tiny Qwen3's settings keep the fastest frequencies, divide
    the slowest by factor, and blend the ones between: the test configs exercise all three."""
    for config in (gpt_oss_config(), qwen3_config(QWEN3_TINY, head_dim=32)):
        params = rope_module.rope_parameters(config)
        dim = config.head_dim
        base = params["rope_theta"] ** -(torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        freq, _ = rope_module._inv_freq_and_scaling(config, dim, None)
        ratio = base / freq
        assert torch.isclose(ratio[0], torch.tensor(1.0)) and torch.isclose(ratio[-1], torch.tensor(params["factor"]))
        assert ((ratio > 1.01) & (ratio < params["factor"] - 0.01)).any()


def test_cos_sin_match_gpt_oss_rotary_embedding() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    config = gpt_oss_config()
    positions = torch.tensor([0, 1, 7, 127, 128, 4095, 4096, 20000])
    want_cos, want_sin = GptOssRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = RotaryEmbedding(config, config.head_dim, max_positions=20001).cos_sin(positions, torch.float32)
    half = config.head_dim // 2  # gpt-oss rotates halves with one cos per pair; Tram's rows repeat it
    for got, want in ((cos, want_cos[0]), (sin, want_sin[0])):
        assert torch.equal(got[:, 0, :half], want) and torch.equal(got[:, 0, half:], want)


@pytest.mark.parametrize("name", ["qwen3-128k", "qwen3-tiny"])
def test_cos_sin_match_qwen3_rotary_embedding(name: str) -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config = CONFIGS[name]()
    positions = torch.tensor([0, 3, 63, 64, 255, 1000, 32767, 32768, 100000])
    want_cos, want_sin = Qwen3RotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = RotaryEmbedding(config, config.head_dim, max_positions=100001).cos_sin(positions, torch.float32)
    assert torch.equal(cos[:, 0], want_cos[0]) and torch.equal(sin[:, 0], want_sin[0])


def test_qwen3_with_yarn_through_the_engine_is_greedy_identical(tmp_path) -> None:
    """A tiny Qwen3 whose YaRN ramp and attention factor shape every position of its prompts: each
    generated token is transformers' argmax after the ones before it (one forward over the whole)."""
    import random

    path = make_hf_model_dir(tmp_path, "qwen3", seed=5, rope_parameters=dict(QWEN3_TINY))
    llm = LLM(path, max_num_seqs=4, max_model_len=128)
    rng = random.Random("qwen3-yarn")
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(20, 60))] for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        tokens = list(out.outputs[0].token_ids)
        assert len(tokens) == 24
        ref = hf_logprobs(path, prompt + tokens)
        assert tokens == ref[len(prompt) - 1 : -1].argmax(dim=-1).tolist(), prompt
