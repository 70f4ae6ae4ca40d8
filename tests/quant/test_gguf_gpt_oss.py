"""gpt-oss served from the GGUF files llama.cpp's tools write for it (`gpt-oss`: attention sinks, sliding
layers alternating with full ones, biases on every projection and expert, YaRN, MXFP4 experts), from a
tiny random Hugging Face model.

The oracles: the float32 file against transformers on the original folder (which the float32
conversion keeps exactly; the folder's settings are the ones llama.cpp fixes for the family, since
the file cannot carry them: a SwiGLU clamp of 7.0 and YaRN's truncated correction range); the
MXFP4 file (llama-quantize's MXFP4_MOE: experts in MXFP4, the rest Q8_0) against the same file
dequantized by llama.cpp itself, served by Tram.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf_tools import convert_batch, dequantize, quantize
from hf_models import KINDS, make_hf_model_dir
from test_gguf_moe import _NOT_IN_FILE, _assert_matches, _generate

from tram import LLM
from tram.model.layers.moe.layer import FusedMoE

# The family's test model with YaRN's correction range truncated, as llama.cpp computes it.
ROPE = {**KINDS["gpt_oss"][1]["rope_parameters"], "truncate": True}
# Rows of 64 (MXFP4 blocks of 32); llama.cpp's fixed clamp; sliding on the even layers as it reads them.
GPT_OSS = dict(intermediate_size=64, swiglu_limit=7.0, rope_parameters=ROPE)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ "hf" (the folder), "f32", "mxfp4" and "mxfp4-f32" (its copy dequantized by llama.cpp)."""
    root = tmp_path_factory.mktemp("gguf_gpt_oss")
    out = {"hf": Path(make_hf_model_dir(root, "gpt_oss", **GPT_OSS))}
    convert_batch([(str(out["hf"]), "f32", root / "f32.gguf")], sentencepiece_vocab=("GptOssForCausalLM",))
    out["f32"] = root / "f32.gguf"
    out["mxfp4"] = quantize(out["f32"], root / "mxfp4.gguf", "MXFP4_MOE")
    out["mxfp4-f32"] = dequantize(out["mxfp4"], root / "mxfp4-f32.gguf")
    return out


def _llm(files: dict[str, Path], name: str) -> LLM:
    # 32 batched tokens: the prompts prefill in two steps, then decode together.
    return LLM(
        str(files[name]), tokenizer=str(files["hf"]), max_num_seqs=4, max_model_len=256, max_num_batched_tokens=32
    )


def _experts(llm: LLM) -> list[FusedMoE]:
    model = llm.llm_engine.engine_core.executor.model_runner.model
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


def test_float32_file_matches_transformers(files: dict[str, Path]):
    import transformers

    from tram.model.gguf.file import load_gguf_config

    config = load_gguf_config(str(files["f32"]))
    assert config.architectures == ["GptOssForCausalLM"]
    want = transformers.AutoConfig.from_pretrained(str(files["hf"])).to_dict()
    got = config.to_dict()
    assert {k: (v, got.get(k)) for k, v in want.items() if k not in _NOT_IN_FILE and got.get(k) != v} == {}
    llm = _llm(files, "f32")
    try:
        oracle = transformers.AutoModelForCausalLM.from_pretrained(str(files["hf"]), dtype=torch.float32).eval()
        _assert_matches(_generate(llm), oracle)
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_mxfp4_experts_match_llama_cpps_dequantization(files: dict[str, Path]):
    """MXFP4 experts are dequantized at load (no MXFP4 kernel on CPU yet), biases included; the tokens
    are those of the file llama.cpp dequantized, and the logprobs agree to float rounding."""
    from gguf import GGMLQuantizationType, GGUFReader

    types = {t.name: t.tensor_type for t in GGUFReader(str(files["mxfp4"])).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == GGMLQuantizationType.MXFP4
    assert types["blk.0.ffn_down_exps.bias"] == GGMLQuantizationType.F32
    results = {}
    for name in ("mxfp4", "mxfp4-f32"):
        llm = _llm(files, name)
        try:
            layers = _experts(llm)
            assert len(layers) == 3 and all(m.w13 is None and m.w13_weight.numel() > 0 for m in layers)
            assert all(torch.count_nonzero(m.w13_bias) > 0 and torch.count_nonzero(m.w2_bias) > 0 for m in layers)
            results[name] = _generate(llm)
        finally:
            llm.llm_engine.engine_core.shutdown()
    for (tokens, logprobs), (want, ref) in zip(results["mxfp4"], results["mxfp4-f32"]):
        assert tokens == want
        assert logprobs == pytest.approx(ref, abs=1e-4)


def _yarn_fields(**extra: float | None) -> SimpleNamespace:
    fields = {
        "gpt-oss.rope.freq_base": 150000.0,
        "gpt-oss.rope.scaling.type": "yarn",
        "gpt-oss.rope.scaling.factor": 32.0,
        "gpt-oss.rope.scaling.original_context_length": 4096,
        **extra,
    }
    return SimpleNamespace(fields={k: v for k, v in fields.items() if v is not None})


def test_yarn_reads_as_llama_cpp_computes_it():
    """gpt-oss-20b's settings: llama.cpp's defaults for the betas, its truncated correction range, and
    its attention factor (the file's attn_factor times 0.1 * ln(factor) + 1) where the file has one."""
    from tram.model.gguf.file import _rope_parameters

    got = _rope_parameters(_yarn_fields(), "gpt-oss", {}, "x.gguf")
    assert got == {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
    }
    scaled = _rope_parameters(_yarn_fields(**{"gpt-oss.rope.scaling.attn_factor": 0.5}), "gpt-oss", {}, "x.gguf")
    assert scaled["attention_factor"] == pytest.approx(0.5 * (0.1 * math.log(32.0) + 1.0))
    missing = _yarn_fields(**{"gpt-oss.rope.scaling.original_context_length": None})
    with pytest.raises(
        ValueError, match="x.gguf: YaRN RoPE scaling without gpt-oss.rope.scaling.original_context_length"
    ):
        _rope_parameters(missing, "gpt-oss", {}, "x.gguf")
