"""Triton W8A16 / W4A16 GEMM (tram/model/quant/triton_linear.py), run by Triton's interpreter on CPU
tensors against reference_linear (dequantize in fp32, then F.linear in fp32, rounded once).

As for the attention kernels, a private copy of the kernel module runs under the interpreter
(tests/triton_interp.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_interp import interpreter_on, load_interpreted, on_device  # noqa: E402

from tram.model.quant.checkpoint_weight import CheckpointInt4Weight  # noqa: E402
from tram.model.quant.weights import Int4Weight, Int8Weight, QuantizedWeight, reference_linear  # noqa: E402

tl_mod = load_interpreted("_tram_triton_linear_interpreted", "tram/model/quant/triton_linear.py")


@pytest.fixture(autouse=True)
def _interpreter_on(request, monkeypatch):
    if "on_cuda" in request.node.name:  # runs the module weights.py imports, as the process set it
        return
    interpreter_on(monkeypatch)


FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
# fp32: exact products, fp32 sums in another order (and int8's scale applied after the sum).
# fp16 / bf16: y is rounded once to x's dtype (half an ulp: 2^-11 / 2^-8 relative) and each int4
# weight once more before tl.dot; |y| <= ~2 here. One wrong nibble moves y by scale * |x| ~ 1e-2 to
# 5e-2: the fp32 cases see it, the half-precision ones check the dtype plumbing.
TOL = {FP32: dict(atol=2e-5, rtol=2e-5), FP16: dict(atol=2e-3, rtol=2e-3), BF16: dict(atol=1.6e-2, rtol=1.6e-2)}


def test_kernels_run_in_the_interpreter():
    assert tl_mod._INTERPRETED != on_device()  # compiled on a GPU machine with TRITON_INTERPRET=0


def _quantized(method: str, n: int, k: int, seed: int) -> QuantizedWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return Int8Weight(w) if method == "int8" else Int4Weight(w, int(method.removeprefix("int4g")))


def _check(qw: QuantizedWeight, x: torch.Tensor, bias: torch.Tensor | None, config=None) -> None:
    got = tl_mod.triton_quant_linear(x, qw.qweight, qw.scale, qw.group, bias, config=config)
    want = reference_linear(x.reshape(-1, x.shape[-1]), qw, bias).view(*x.shape[:-1], -1)
    assert got.dtype == x.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[x.dtype])


# Rows: a decode, a few, and past the decode tile (17: a second config, one partial row tile).
# N 40: a partial column tile. K 64/128 with groups 32/64/128 (1..4 groups, K tiles of 32..128).
CASES = [
    (m, n, k, method)
    for m in (1, 3, 17)
    for n, k, method in [
        (16, 64, "int8"),
        (40, 128, "int8"),
        (40, 64, "int4g32"),
        (16, 128, "int4g32"),
        (40, 128, "int4g64"),
        (16, 128, "int4g128"),
    ]
]


@pytest.mark.parametrize("m,n,k,method", CASES)
def test_fp32_matches_reference(m: int, n: int, k: int, method: str):
    qw = _quantized(method, n, k, seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    _check(qw, x, torch.randn(n) if m != 3 else None)


@pytest.mark.parametrize("dtype", [FP16, BF16])
@pytest.mark.parametrize("method", ["int8", "int4g32", "int4g64"])
def test_half_precision_matches_reference(dtype: torch.dtype, method: str):
    qw = _quantized(method, 40, 128, seed=1)
    for m in (1, 17):
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m)).to(dtype)
        _check(qw, x, torch.randn(40).to(dtype))


@pytest.mark.parametrize("method", ["int8", "int4g32"])
def test_strided_and_batched_x_and_forced_tiles(method: str):
    qw = _quantized(method, 40, 64, seed=2)
    wide = torch.randn(2, 5, 3 * 64)
    _check(qw, wide[..., 64:128], torch.randn(40))  # [2, 5, 64] view: row stride 192
    # Several row and column tiles in one launch, and int8's K tile longer than K (masked).
    x = torch.randn(37, 64)
    _check(qw, x, None, config=(16, 16, 128 if method == "int8" else 32, 4))


def test_int8_k_not_a_multiple_of_the_tile():
    qw = _quantized("int8", 24, 100, seed=3)  # per-channel int8 takes any K
    _check(qw, torch.randn(5, 100), torch.randn(24), config=(16, 16, 32, 4))


def test_configs_keep_int4_tiles_inside_a_group():
    for rows in (1, 16, 17, 64, 65, 4096):
        for group in (32, 64, 96, 128, 256):
            block_m, block_n, block_k, _ = tl_mod.quant_linear_config(rows, group)
            assert group % block_k == 0 and block_k % 32 == 0 and block_m >= 16 and block_n >= 16
        assert tl_mod.quant_linear_config(rows, 0)[2] >= 16


def test_empty_batch():
    qw = _quantized("int4g32", 16, 64, seed=4)
    assert tl_mod.triton_quant_linear(torch.randn(0, 64), qw.qweight, qw.scale, qw.group).shape == (0, 16)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["int8", "int4g64"])
def test_apply_on_cuda_goes_through_triton(method: str):
    # The weights.py wiring, compiled (or interpreted, if TRITON_INTERPRET=1) on the device.
    qw = _quantized(method, 256, 512, seed=5)
    want_x = torch.randn(33, 512)
    want = reference_linear(want_x, qw, None)
    qw.qweight, qw.scale = qw.qweight.cuda(), qw.scale.cuda()
    got = qw.apply(want_x.cuda(), None)
    assert got.is_cuda
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def _checkpoint_int4(n: int, k: int, group: int, zero: bool, perm: bool, seed: int) -> CheckpointInt4Weight:
    """A checkpoint's int4 weight: random nibbles, group scales, zero points 0..15 (asymmetric, as
    AWQ and GPTQ asym store them) and an act-order permutation of the input columns."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    scale = torch.rand(n, k // group, generator=g) * 0.01 + 0.001
    zeros = torch.randint(0, 16, (n, k // group), generator=g) if zero else None
    order = torch.randperm(k, generator=g) if perm else None
    return CheckpointInt4Weight(q, scale, group, zeros, order)


@pytest.mark.parametrize("zero,perm", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_checkpoint_zero_points_and_act_order_match_reference(
    zero: bool, perm: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
):
    # Through CheckpointInt4Weight.apply, as a GPU runs it (use_triton: on CPU tensors, interpreted).
    import tram.model.quant.triton_linear as triton_linear

    monkeypatch.setattr(triton_linear, "triton_quant_linear", tl_mod.triton_quant_linear)
    qw = _checkpoint_int4(40, 128, 32 if perm else 64, zero, perm, seed=6)
    qw.use_triton = True
    for m in (1, 17):
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m)).to(dtype)
        bias = torch.randn(40).to(dtype)
        got = qw.apply(x, bias)
        torch.testing.assert_close(got.float(), reference_linear(x, qw, bias).float(), **TOL[dtype])
    got = qw.apply(torch.ones(2, 3, 128, dtype=dtype), None)  # lead dimensions kept around the permutation
    assert got.shape == (2, 3, 40)


def test_zero_points_of_8_are_the_symmetric_kernel():
    sym = _checkpoint_int4(40, 128, 32, zero=False, perm=False, seed=7)
    eights = torch.full_like(sym.scale, 8, dtype=torch.uint8)
    x = torch.randn(5, 128)
    got = tl_mod.triton_quant_linear(x, sym.qweight, sym.scale, 32, zero=eights)
    assert torch.equal(got, tl_mod.triton_quant_linear(x, sym.qweight, sym.scale, 32))


def test_quantized_weights_move_to_a_device_whole():
    qw = _checkpoint_int4(16, 64, 32, zero=True, perm=True, seed=8).to_(torch.device("meta"))
    assert all(t.is_meta for t in (qw.qweight, qw.scale, qw.zero, qw.perm))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_checkpoint_apply_on_cuda_goes_through_triton():
    qw = _checkpoint_int4(256, 512, 128, zero=True, perm=True, seed=9)
    x = torch.randn(33, 512)
    want = reference_linear(x, qw, None)
    got = qw.to_(torch.device("cuda")).apply(x.cuda(), None)
    assert got.is_cuda
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
