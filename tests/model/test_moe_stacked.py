"""gpt-oss's experts: stacked and MXFP4 checkpoint tensors into FusedMoE, against transformers'
GptOssMLP on the same random weights, whole and cut over two ranks (expert or tensor parallel)."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

from tram.distributed.parallel_state import TensorParallel, set_expert_parallel, set_tp
from tram.model.layers.moe.block import SparseMoEBlock
from tram.model.layers.moe.router import select_experts
from tram.model.layers.moe.spec import MoESpec
from tram.model.layers.moe.stacked import StackedFusedMoE, dequantize_mxfp4

HIDDEN, WIDTH, EXPERTS, TOP_K = 64, 96, 6, 2


def _reference() -> GptOssMLP:
    config = GptOssConfig(
        hidden_size=HIDDEN,
        intermediate_size=WIDTH,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        swiglu_limit=1.5,  # low enough that the clamps cut
    )
    torch.manual_seed(0)
    mlp = GptOssMLP(config)
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0, 0.3)
    return mlp.eval()


def _mlp_out(ref: GptOssMLP, x: torch.Tensor) -> torch.Tensor:
    """transformers' MLP output for x [T, hidden] (it returns (out, router logits) in some versions)."""
    out = ref(x[None])
    return (out if isinstance(out, torch.Tensor) else out[0]).reshape(x.shape)


def _spec() -> MoESpec:
    return MoESpec(
        EXPERTS,
        TOP_K,
        WIDTH,
        renormalize=False,
        scoring="topk_softmax",
        activation="swiglu_oai",
        bias=True,
        swiglu_limit=1.5,
    )


def _block(tensors: dict[str, torch.Tensor], rank: int = 0, size: int = 1, ep: bool = False) -> SparseMoEBlock:
    set_tp(TensorParallel(rank, size))
    set_expert_parallel(ep)
    try:
        block = SparseMoEBlock(_spec(), HIDDEN, torch.float32, experts_cls=StackedFusedMoE)
    finally:
        set_tp(TensorParallel())
        set_expert_parallel(False)
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name.startswith("router."):
                getattr(block.gate, name.split(".")[1]).copy_(tensor)
            else:
                block.experts.load_checkpoint_tensor(name.removeprefix("experts."), tensor)
    assert block.experts.loaded_params() == {"w13_weight", "w13_bias", "w2_weight", "w2_bias"}
    return block


def _outputs(blocks: list[SparseMoEBlock], x: torch.Tensor) -> torch.Tensor:
    """The ranks' partial outputs summed, as the all-reduce would (each rank runs its experts only)."""
    total = torch.zeros_like(x)
    for block in blocks:
        weights, ids = select_experts(block.gate(x), TOP_K, "topk_softmax", False)
        total += block.experts.rank_output(x, weights, ids)
    return total


@pytest.mark.parametrize("ranks,ep", [(1, False), (2, True), (2, False)], ids=["whole", "ep2", "tp2"])
def test_stacked_experts_match_transformers(ranks: int, ep: bool) -> None:
    ref = _reference()
    tensors = {name: p.detach() for name, p in ref.named_parameters()}
    x = torch.randn(9, HIDDEN)
    with torch.no_grad():
        expected = _mlp_out(ref, x)
        blocks = [_block(tensors, r, ranks, ep) for r in range(ranks)]
        got = _outputs(blocks, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def _mxfp4(rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.randint(0, 256, (EXPERTS, rows, cols // 32, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 130, (EXPERTS, rows, cols // 32), generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_dequantizes_as_transformers_does() -> None:
    gen = torch.Generator().manual_seed(1)
    blocks, scales = _mxfp4(2 * WIDTH, HIDDEN, gen)
    ours = dequantize_mxfp4(blocks, scales)  # [E, out, in]
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=0, atol=0)


def test_mxfp4_experts_load_as_their_dequantized_weights() -> None:
    """Blocks and scales arriving in either order give the layer transformers' dequantized weights."""
    ref = _reference()
    gen = torch.Generator().manual_seed(2)
    gu_blocks, gu_scales = _mxfp4(2 * WIDTH, HIDDEN, gen)
    down_blocks, down_scales = _mxfp4(HIDDEN, WIDTH, gen)
    with torch.no_grad():
        ref.experts.gate_up_proj.copy_(convert_moe_packed_tensors(gu_blocks, gu_scales, dtype=torch.float32))
        ref.experts.down_proj.copy_(convert_moe_packed_tensors(down_blocks, down_scales, dtype=torch.float32))
    tensors = {
        "router.weight": ref.router.weight.detach(),
        "router.bias": ref.router.bias.detach(),
        "experts.gate_up_proj_blocks": gu_blocks,
        "experts.gate_up_proj_scales": gu_scales,
        "experts.down_proj_scales": down_scales,
        "experts.down_proj_blocks": down_blocks,
        "experts.gate_up_proj_bias": ref.experts.gate_up_proj_bias.detach(),
        "experts.down_proj_bias": ref.experts.down_proj_bias.detach(),
    }
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        expected = _mlp_out(ref, x)
        got = _block(tensors)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_stacked_tensor_of_the_wrong_shape_is_named() -> None:
    block = SparseMoEBlock(_spec(), HIDDEN, torch.float32, experts_cls=StackedFusedMoE)
    with pytest.raises(ValueError, match=r"has shape \(6, 64, 190\), the model expects \(6, 64, 192\)"):
        block.experts.load_checkpoint_tensor("gate_up_proj", torch.zeros(EXPERTS, HIDDEN, 190))
