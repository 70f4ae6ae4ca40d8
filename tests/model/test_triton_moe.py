"""Triton fused MoE (tram/model/layers/moe/triton_moe.py), run by Triton's interpreter on CPU tensors
against a plain PyTorch reference: per expert, gather its tokens, two fp32 matmuls, the activation,
a weighted index_add into an fp32 output rounded once.

As for the other Triton kernels, a private copy of the kernel module runs under the interpreter
(tests/triton_interp.py). Routing always leaves expert 3 without tokens and marks some slots -1.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from moe_oracle import reference_moe  # noqa: E402
from triton_interp import interpreter_on, load_interpreted, on_device  # noqa: E402

moe = load_interpreted("_tram_triton_moe_interpreted", "tram/model/layers/moe/triton_moe.py")


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    interpreter_on(monkeypatch)


E, K, H, I = 4, 2, 32, 48
FP32, BF16 = torch.float32, torch.bfloat16
# fp32: exact products summed in another order. bf16: act is rounded to bf16 before the second dot
# (the reference keeps it in fp32) and the output once more; |out| is ~1 here.
TOL = {FP32: dict(atol=2e-5, rtol=2e-5), BF16: dict(atol=3e-2, rtol=3e-2)}


def test_kernels_run_in_the_interpreter():
    assert moe._INTERPRETED != on_device()  # compiled on a GPU machine with TRITON_INTERPRET=0


def _routing(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct experts of 0..2 per token (expert 3 stays empty), every third slot -1 (for T=5 one
    token has both slots skipped), softmax-like positive weights."""
    # Drawn on the CPU whatever the default device, so that every run routes the same way.
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(E - 1, generator=g, device="cpu")[:K] for _ in range(t)]).to(torch.int32)
    flat = ids.view(-1)
    flat[2::3] = -1
    if t == 5:
        ids[3] = -1
    weights = torch.rand(t, K, generator=g, device="cpu") + 0.1
    device = torch.get_default_device()
    return ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)


def _weights(bias: bool, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * 0.4
    w2 = torch.randn(E, H, I, generator=g) * 0.2
    b13 = torch.randn(E, 2 * I, generator=g) if bias else None
    b2 = torch.randn(E, H, generator=g) * 0.5 if bias else None
    return [None if w is None else w.to(dtype) for w in (w13, w2, b13, b2)]


# Configs: the default (one block per expert, N and K tiles wider than I and H), and BLOCK_M 2 with
# 32-wide tiles (for T=5 an expert spans two blocks, one of them padded; a partial N tile of I in the
# first GEMM and a partial K tile of I in the second).
SMALL = (2, 32, 32, 4)


@pytest.mark.parametrize("config", [None, SMALL], ids=["default", "small"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("t", [1, 5])
def test_fused_moe_matches_reference(t, activation, bias, config):
    ids, topk_w = _routing(t, seed=t)
    w13, w2, b13, b2 = _weights(bias, FP32, seed=10 + t)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(20 + t))
    # A small limit so that gpt-oss's clamps cut some of the gate and up values.
    extra = dict(alpha=1.5, limit=2.0) if activation == "swiglu_oai" else {}
    got = moe.triton_fused_moe(x, ids, topk_w, w13, w2, b13, b2, activation, **extra, config=config)
    want = reference_moe(x, ids, topk_w, w13, w2, b13, b2, activation, **extra)
    assert got.dtype == x.dtype and got.shape == x.shape
    if t == 5:
        assert torch.bincount(ids[ids >= 0], minlength=E).max() > SMALL[0]
    torch.testing.assert_close(got, want, **TOL[FP32])
    if t == 5:  # both slots skipped: nothing, not even b2
        assert torch.equal(got[3], torch.zeros(H))


def test_fused_moe_bf16_and_strided_x():
    ids, topk_w = _routing(5, seed=7)
    w13, w2, b13, b2 = _weights(True, BF16, seed=8)
    x = torch.randn(H, 5, generator=torch.Generator().manual_seed(9)).to(BF16).T  # non-contiguous rows
    got = moe.triton_fused_moe(x, ids, topk_w, w13, w2, b13, b2, "swiglu_oai", config=SMALL)
    want = reference_moe(x, ids, topk_w, w13, w2, b13, b2, "swiglu_oai")
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want.float(), **TOL[BF16])


@pytest.mark.parametrize("block_m", [1, 4, 16])
def test_align_pairs(block_m):
    ids, _ = _routing(5, seed=3)
    pair_ids, block_expert = moe.align_pairs(ids, E, block_m)
    n = ids.numel()
    assert pair_ids.numel() == block_expert.numel() * block_m
    blocks = pair_ids.view(-1, block_m).long()
    flat = ids.view(-1).long()
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        real = blocks[b][blocks[b] < n]
        if e < 0:
            assert real.numel() == 0
            continue
        assert real.numel() > 0 and (flat[real] == e).all()
        seen += real.tolist()
    assert sorted(seen) == (flat >= 0).nonzero().view(-1).tolist()  # each routed pair once, no -1 pair
    assert 3 not in block_expert.tolist()  # the empty expert has no block
    used = block_expert[block_expert >= 0]
    assert torch.equal(used, used.sort().values)  # blocks in expert order, padding only at the end


def test_no_tokens():
    w13, w2, _, _ = _weights(False, FP32, seed=0)
    x = torch.zeros(0, H)
    got = moe.triton_fused_moe(x, torch.zeros(0, K, dtype=torch.int32), torch.zeros(0, K), w13, w2, None, None, "silu")
    assert got.shape == (0, H)


def test_fused_moe_layer_dispatches_to_the_kernel(monkeypatch) -> None:
    """FusedMoE on a device (use_triton here) runs triton_fused_moe: the same output as its grouped path."""
    import sys

    from tram.model.layers.moe.layer import FusedMoE
    from tram.model.layers.moe.spec import MoESpec

    calls = []
    monkeypatch.setitem(sys.modules, "tram.model.layers.moe.triton_moe", moe)
    original = moe.triton_fused_moe
    monkeypatch.setattr(moe, "triton_fused_moe", lambda *a, **k: calls.append(1) or original(*a, **k))
    torch.manual_seed(0)
    spec = MoESpec(4, 2, 48, renormalize=True, activation="swiglu_oai", bias=True, swiglu_limit=2.0)
    layer = FusedMoE(spec, 32, torch.float32)
    for p in layer.parameters():
        p.data.normal_(0, 0.2)
    x = torch.randn(5, 32)
    ids = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]], dtype=torch.int32)
    weights = torch.softmax(torch.randn(5, 2), -1)
    with torch.no_grad():
        expected = layer(x, weights, ids)
        layer.use_triton = True
        got = layer(x, weights, ids)
    assert calls
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
