"""Mixture-of-experts layers beyond one rank and one weight form: expert parallelism and tensor
parallelism at size 2 against transformers, quantized experts against their dequantized weights,
and the checkpoints and settings that must fail at start with one line naming what is wrong.

The families themselves (greedy and logprobs, chunked prefill, prefix caching, preemption) run in
test_new_families.py beside the dense ones.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from api_helpers import assert_no_leak
from hf_models import make_hf_model_dir
from test_new_families import _greedy, _prompts, _token_ids, assert_all_greedy, model_dir  # noqa: F401 - a fixture

from tram import LLM
from tram.model.layers.moe.experts import ExpertWeights
from tram.model.layers.moe.layer import FusedMoE
from tram.model.layers.moe.reference import grouped_moe
from tram.model.layers.moe.spec import MoESpec


@pytest.mark.parametrize(
    "kind,expert_parallel",
    [("qwen3_moe", True), ("gpt_oss", True), ("mixtral", False), ("mixtral", True)],
    ids=["qwen3_moe-ep2", "gpt_oss-ep2", "mixtral-tp2", "mixtral-ep2"],
)
def test_two_ranks_greedy_matches_transformers(kind: str, expert_parallel: bool, model_dir) -> None:
    """Two ranks, each with half the experts (EP) or half of every expert's channels (TP); a 16-token
    budget chunks the longer prompts beside decodes. (Qwen3-MoE's and gpt-oss's TP=2 run in
    test_new_families.)"""
    path = model_dir(kind)
    prompts = _prompts(kind + "-ranks", count=3)
    llm = LLM(
        path,
        tensor_parallel_size=2,
        enable_expert_parallel=expert_parallel,
        max_num_seqs=8,
        max_num_batched_tokens=16,
        max_model_len=128,
    )
    try:
        assert_all_greedy(path, prompts, _token_ids(llm, prompts, _greedy(max_tokens=12)))
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_experts_compute_with_their_dequantized_weights(method: str) -> None:
    """After quantize_, the layer's output is the grouped product with the dequantized experts
    (what the quantized forms mean), and close to the float layer's."""
    torch.manual_seed(0)
    spec = MoESpec(num_experts=6, top_k=2, intermediate_size=64, renormalize=True)
    layer = FusedMoE(spec, 96, torch.float32)
    layer.w13_weight.data.normal_(0, 0.1)
    layer.w2_weight.data.normal_(0, 0.1)
    x = torch.randn(7, 96)
    weights = torch.softmax(torch.randn(7, 2), -1)
    ids = torch.stack([torch.randperm(6)[:2] for _ in range(7)]).to(torch.int32)
    with torch.no_grad():
        dense = layer(x, weights, ids)
        layer.quantize_(method)
        quantized = layer(x, weights, ids)
    assert layer.w13 is not None and layer.w13.kind == method and layer.w13_weight.numel() == 0
    w13 = ExpertWeights("float", layer.w13.dequantize(), 128, 96)
    w2 = ExpertWeights("float", layer.w2.dequantize(), 96, 64)
    expected = grouped_moe(x, ids, weights, w13, w2, None, None, "silu")
    torch.testing.assert_close(quantized, expected, rtol=1e-4, atol=1e-5)
    rel = ((quantized - dense).norm() / dense.norm()).item()
    assert rel < (0.02 if method == "int8" else 0.2), rel


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_moe_model_serves_without_leaks(method: str, model_dir) -> None:
    """`quantization=` reaches the experts too (the unit test above checks their arithmetic): the
    engine serves a batch on them, and int8's greedy tokens start as the float model's."""
    path = model_dir("qwen3_moe")
    prompts = _prompts("moe-quant", count=3)
    llm = LLM(path, quantization=method, max_num_seqs=8, max_model_len=128)
    outs = _token_ids(llm, prompts, _greedy(max_tokens=6))
    assert all(len(o) == 6 for o in outs)
    assert_no_leak(llm.llm_engine)
    if method == "int8":
        floats = _token_ids(LLM(path, max_num_seqs=8, max_model_len=128), prompts, _greedy(max_tokens=6))
        assert [o[0] for o in outs] == [f[0] for f in floats]


def _edited(src: str, tmp: str, **config: object) -> str:
    """A copy of the model folder whose config.json has `config` changed."""
    dst = os.path.join(tmp, "edited_" + "_".join(f"{k}{v}" for k, v in config.items()))
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        data = json.load(f)
    data.update(config)
    if "num_experts" in config:  # transformers 5 writes the count under both names
        data["num_local_experts"] = config["num_experts"]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(data, f)
    return dst


@pytest.mark.parametrize(
    "config,message",
    [
        (dict(num_experts=6), "expert 6, but the config has 6 experts"),
        (dict(num_experts=10), "mlp.gate.weight has shape (8, 64)"),
        (dict(moe_intermediate_size=40), "has shape (64, 48) in"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok (9) must be between 1 and the number of experts (8)"),
    ],
    ids=["fewer-experts", "more-experts", "expert-width", "top-k"],
)
def test_checkpoint_disagreeing_with_its_config_fails_naming_it(config, message, model_dir, tmp_path) -> None:
    path = _edited(model_dir("qwen3_moe"), str(tmp_path), **config)
    with pytest.raises(ValueError) as err:
        LLM(path, max_model_len=64)
    assert message in str(err.value)
    assert "\n" not in str(err.value).strip()


def test_expert_parallel_size_must_divide_the_experts(model_dir, tmp_path) -> None:
    path = _edited(model_dir("qwen3_moe"), str(tmp_path), num_experts=6)
    with pytest.raises(ValueError, match="expert-parallel size 4 does not divide the model's 6 experts"):
        LLM(path, tensor_parallel_size=4, enable_expert_parallel=True, max_model_len=64)
    path = _edited(model_dir("qwen3_moe"), str(tmp_path), moe_intermediate_size=50)
    with pytest.raises(ValueError, match="tensor_parallel_size 4 does not divide the experts' intermediate size 50"):
        LLM(path, tensor_parallel_size=4, max_model_len=64)


def _mxfp4_copy(float_dir: str, out: str) -> str:
    """float_dir's gpt-oss with its experts replaced by random MXFP4 blocks (as OpenAI released it,
    quant_method mxfp4) in `out`; float_dir's experts become those blocks' dequantized values, so
    transformers on float_dir is the oracle of Tram on `out`."""
    from safetensors.torch import load_file, save_file

    from tram.model.layers.moe.stacked import dequantize_mxfp4

    gen = torch.Generator().manual_seed(3)
    shutil.copytree(float_dir, out)
    tensors = load_file(os.path.join(float_dir, "model.safetensors"))
    packed, dense = {}, dict(tensors)
    for name, t in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            packed[name] = t
            continue
        experts, k, n = t.shape  # [E, in, out]
        blocks = torch.randint(0, 256, (experts, n, k // 32, 16), generator=gen, dtype=torch.uint8)
        scales = torch.randint(122, 127, (experts, n, k // 32), generator=gen, dtype=torch.uint8)
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        dense[name] = dequantize_mxfp4(blocks, scales).transpose(1, 2).contiguous()
    save_file(packed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(dense, os.path.join(float_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    return out


def test_gpt_oss_mxfp4_checkpoint_matches_its_dequantized_weights(tmp_path) -> None:
    float_dir = make_hf_model_dir(tmp_path, "gpt_oss", intermediate_size=64, hidden_size=64)
    mxfp4_dir = _mxfp4_copy(float_dir, str(tmp_path / "mxfp4"))
    prompts = _prompts("mxfp4", count=3)
    llm = LLM(mxfp4_dir, max_num_seqs=8, max_model_len=128)
    assert_all_greedy(float_dir, prompts, _token_ids(llm, prompts, _greedy(max_tokens=10)))
    assert_no_leak(llm.llm_engine)
