"""Quantized MoE checkpoints: a random Qwen3-MoE whose every linear (each expert's gate, up and down
included; the router stays float, as quantizers leave it) is GPTQ-, AWQ- or compressed-tensors-packed.
Tram's greedy tokens and logprobs must be transformers' on the dequantized weights, on one rank and
on two (tensor parallel: each expert's channels cut; expert parallel: whole experts per rank)."""

from __future__ import annotations

import pytest
from hf_models import make_hf_model_dir
from quant_oracle import assert_matches_oracle, hf_oracle, write_checkpoints
from test_hf_quantized import _awq, _compressed, _gptq

from tram import LLM
from tram.model.layers.moe.layer import FusedMoE

SCHEMES = {
    "gptq-g64-asym-actorder": _gptq(64, False, True),
    "gptq-g64-sym": _gptq(64, True, False),
    "awq-g64": _awq(64),
    "ct-w8a16-channel": _compressed(8, -1, True),
}
# The form each scheme's experts take: stacked for the fused kernels, or per expert (act-order).
EXPERT_FORM = {
    "gptq-g64-asym-actorder": ("modules", False),
    "gptq-g64-sym": ("int4", False),
    "awq-g64": ("int4", True),
    "ct-w8a16-channel": ("int8", False),
}
PROMPTS = [[1, 5, 9, 200, 301], [1] + list(range(60, 83))]  # the longer one prefills past the skinny rows


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """scheme -> (quantized folder, float folder of its dequantized weights). Rows of 128: int4
    groups of 64 fit every projection and each of two ranks' halves."""
    float_dir = make_hf_model_dir(
        tmp_path_factory.mktemp("moe_float"), "qwen3_moe", hidden_size=128, moe_intermediate_size=128
    )
    return write_checkpoints(float_dir, tmp_path_factory.mktemp("moe_quantized"), SCHEMES)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_quantized_moe_checkpoint_matches_transformers(scheme: str, checkpoints) -> None:
    quantized, dequantized = checkpoints[scheme]
    llm = LLM(quantized, max_model_len=64, max_num_seqs=4)
    assert_matches_oracle(llm, hf_oracle(dequantized), PROMPTS, max_tokens=6, ignore_eos=True)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp2", "ep2"])
def test_quantized_moe_checkpoint_over_two_ranks(expert_parallel: bool, checkpoints) -> None:
    quantized, dequantized = checkpoints["gptq-g64-asym-actorder"]
    llm = LLM(
        quantized, tensor_parallel_size=2, enable_expert_parallel=expert_parallel, max_model_len=64, max_num_seqs=4
    )
    try:
        assert_matches_oracle(llm, hf_oracle(dequantized), PROMPTS, max_tokens=6, ignore_eos=True)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_quantized_experts_are_kept_quantized(scheme: str, checkpoints) -> None:
    """The experts compute with the checkpoint's packed weights (stacked for the fused kernels where
    their layout allows: zero points kept, no act-order); no float expert weight is kept."""
    from tram.config import ModelConfig
    from tram.model.loader import load_model

    quantized, _ = checkpoints[scheme]
    model = load_model(ModelConfig(model=quantized))
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    kind, zero_points = EXPERT_FORM[scheme]
    assert layers and all(w.kind == kind for m in layers for w in (m.w13, m.w2))
    assert all((w.zero is not None) == zero_points for m in layers for w in (m.w13, m.w2))
    assert all(m.w13_weight.numel() == 0 and m.w2_weight.numel() == 0 for m in layers)
