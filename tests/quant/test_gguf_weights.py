"""GGUF weights kept in their block layouts (tram/model/gguf/weight.py, csrc/gguf_linear.cpp):
the PyTorch dequantizer bit for bit against the gguf package's, and the C++ kernels against
dequantize-then-matmul on random but valid blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from kernel_checks import assert_batch_and_thread_invariant, assert_close_to_reference, assert_slabs_match

from tram.model.gguf.weight import (
    BLOCK_SIZES,
    GGUF_KEPT_TYPES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    GGUFWeight,
    dequantize_gguf,
)
from tram.model.kernels.cpu_kernels import cpu_kernels_available
from tram.model.quant import weights
from tram.model.quant.weights import SKINNY_MAX_ROWS, reference_linear

TYPES = [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K]
NAMES = {Q8_0: "Q8_0", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
FP16_OFFSETS = {  # d (and m or dmin) in a block
    Q8_0: (0,),
    Q4_0: (0,),
    Q4_1: (0, 2),
    Q5_0: (0,),
    Q5_1: (0, 2),
    Q4_K: (0, 2),
    Q5_K: (0, 2),
    Q6_K: (208,),
}


def _ks(ggml_type: int) -> list[int]:
    return [96, 256, 512] if BLOCK_SIZES[ggml_type][0] == 32 else [256, 512]


def _blocks(ggml_type: int, n: int, k: int, seed: int) -> torch.Tensor:
    """[n, row_bytes] of random bytes with finite fp16 scales: every bit pattern of the quants is valid."""
    g = np.random.default_rng(seed)
    block, size = BLOCK_SIZES[ggml_type]
    raw = g.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    scale = 0.05 / block if block == 256 else 0.05 / 8  # K-quants' scales multiply 6-bit sub-scales
    for off in FP16_OFFSETS[ggml_type]:
        d = (g.standard_normal((n, k // block, 1)) * scale).astype(np.float16)
        raw[..., off : off + 2] = d.view(np.uint8)
    return torch.from_numpy(raw.reshape(n, -1))


def _gguf(data: torch.Tensor, ggml_type: int) -> torch.Tensor:
    return torch.from_numpy(gguf_dequantize(data.numpy(), gguf.GGMLQuantizationType(ggml_type)))


def test_type_ids_and_block_sizes_are_gguf_s():
    for t in TYPES:
        assert gguf.GGMLQuantizationType[NAMES[t]] == t
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)] == BLOCK_SIZES[t]
    assert GGUF_KEPT_TYPES == set(TYPES)
    assert gguf.GGMLQuantizationType.Q4_K in GGUF_KEPT_TYPES  # the enum's members look up as their ids


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_dequantize_is_gguf_s_bit_for_bit(ggml_type: int):
    for k in _ks(ggml_type):
        data = _blocks(ggml_type, 9, k, k)
        got = dequantize_gguf(data, ggml_type, k)
        assert got.dtype == torch.float32 and got.shape == (9, k)
        assert torch.equal(got.view(torch.int32), _gguf(data, ggml_type).view(torch.int32))


@pytest.mark.parametrize("ggml_type", [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1], ids=NAMES.get)
def test_dequantize_of_gguf_s_own_quantization(ggml_type: int):
    w = np.random.default_rng(1).standard_normal((12, 96)).astype(np.float32) * 0.05
    data = torch.from_numpy(gguf_quantize(w, gguf.GGMLQuantizationType(ggml_type)))
    got = dequantize_gguf(data, ggml_type, 96)
    assert torch.equal(got, _gguf(data, ggml_type))
    assert (got - torch.from_numpy(w)).abs().max() < 0.05 * 4 / 7  # within a step of the 4-bit grid


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_cpp_dequantize_is_the_reference(ggml_type: int):
    with torch.inference_mode():
        kernels = weights._kernels(torch.empty(1, 32))
    if kernels is None:
        pytest.skip("the C++ kernels are not available")
    for k in _ks(ggml_type):
        data = _blocks(ggml_type, 33, k, 3)
        want = GGUFWeight(data, ggml_type, k).dequantize()
        with torch.inference_mode():
            for dtype in (torch.float32, torch.bfloat16):
                out = torch.empty(33, k, dtype=dtype)
                kernels.gguf_dequantize_(out, data, ggml_type)
                # Each weight its dequantized value, then one rounding; bits, so that -0 is not +0.
                bits = torch.int32 if dtype == torch.float32 else torch.int16
                assert torch.equal(out.view(bits), want.to(dtype).view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_kernels_match_dequantize_then_matmul(ggml_type: int, dtype: torch.dtype):
    for n in (33, 50, 131):  # 131: past one tile of the GEMM (64 rows), odd
        for k in _ks(ggml_type):
            qw = GGUFWeight(_blocks(ggml_type, n, k, n + k), ggml_type, k)
            bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
            for rows in (1, 3, 5, SKINNY_MAX_ROWS, SKINNY_MAX_ROWS + 1, 40, 100):  # the kernel, then the tiled GEMM
                x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
                with torch.inference_mode():
                    got, want = qw.apply(x, bias), reference_linear(x, qw, bias)
                assert want.shape == (rows, n)
                assert_close_to_reference(got, want, dtype)


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_kernel_is_invariant_to_batch_and_threads(ggml_type: int):
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available (the reference's GEMM is not batch-invariant)")
    for k in _ks(ggml_type):
        qw = GGUFWeight(_blocks(ggml_type, 96, k, 5), ggml_type, k)
        assert_batch_and_thread_invariant(lambda x: qw.apply(x, None), torch.randn(SKINNY_MAX_ROWS, k))


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_gemm_is_invariant_to_batch_and_threads(monkeypatch, ggml_type: int):
    """The tiled GEMM's outputs do not depend on the rows beside them nor on the thread count. Kernels
    built without AVX-512 send these 100 rows to MKL's slabs (slab_gemm.py), whose order of additions
    is MKL's and may change with the threads (it does on AMD's Zen 4): kept on the tiled GEMM here."""
    from tram.model.quant import slab_gemm

    monkeypatch.setattr(slab_gemm, "float32_gemm_faster", lambda kernels: False)
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available (the reference's GEMM is not batch-invariant)")
    threads = torch.get_num_threads()
    qw = GGUFWeight(_blocks(ggml_type, 150, 256, 6), ggml_type, 256)  # three tiles, the last partial
    x = torch.randn(100, 256)
    with torch.inference_mode():
        together = qw.apply(x, None)
        assert torch.equal(qw.apply(x[5 : 5 + SKINNY_MAX_ROWS + 3], None), together[5 : 5 + SKINNY_MAX_ROWS + 3])
        for n in (1, 2):
            torch.set_num_threads(n)
            try:
                assert torch.equal(qw.apply(x, None), together)
            finally:
                torch.set_num_threads(threads)


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_passes_over_long_rows_change_no_bit(monkeypatch, ggml_type: int):
    """Past 1024 k both kernels carry their sums in float32 memory from one pass over k to the next
    (the skinny kernel from eight rows of x on, the tiled GEMM always). At K = 1280 (two passes, the
    second short): sixteen rows equal one row at a time, and with x zero past k = 1024 both kernels
    give the one-pass result of the weight's first 1024 k, bit for bit (adding 0 * w changes no sum).
    Kernels built without AVX-512 would send the 40 rows to MKL's slabs (slab_gemm.py), whose order
    of additions is MKL's: kept on the tiled GEMM here."""
    from tram.model.quant import slab_gemm

    monkeypatch.setattr(slab_gemm, "float32_gemm_faster", lambda kernels: False)
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available (the reference's GEMM is not batch-invariant)")
    k, short = 1280, 1024
    block, size = BLOCK_SIZES[ggml_type]
    data = _blocks(ggml_type, 70, k, 7)
    qw = GGUFWeight(data, ggml_type, k)
    head = GGUFWeight(data[:, : short // block * size].contiguous(), ggml_type, short)
    assert_batch_and_thread_invariant(lambda x: qw.apply(x, None), torch.randn(SKINNY_MAX_ROWS, k))
    x = torch.randn(40, short)
    padded = torch.cat([x, torch.zeros(40, k - short)], dim=1)
    with torch.inference_mode():
        for rows in (9, SKINNY_MAX_ROWS, 40):  # eight rows and one, sixteen, then the tiled GEMM
            assert torch.equal(qw.apply(padded[:rows], None), head.apply(x[:rows], None))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("ggml_type", [Q5_0, Q4_K, Q6_K, Q8_0], ids=NAMES.get)
def test_many_rows_decode_slabs_for_the_library_gemm(monkeypatch, ggml_type: int, dtype: torch.dtype):
    """x past SKINNY_MAX_ROWS where the library GEMM wins (bf16: native bf16 GEMMs; float32: kernels
    built without AVX-512): W decoded to x's dtype a slab at a time (slab_gemm.py); 131 outputs in
    slabs of 48, 48 and 35."""
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available")
    qw = GGUFWeight(_blocks(ggml_type, 131, 256, 11), ggml_type, 256)
    x = torch.randn(40, 256).to(dtype)
    assert_slabs_match(monkeypatch, qw, x, torch.randn(131).to(dtype), 48)


class _Build:
    """A stand-in for the kernels module's build facts."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def vector_bits(self) -> int:
        return self.bits


def test_slabs_take_only_rows_that_repay_the_decode(monkeypatch):
    """bfloat16 x with native bf16 GEMMs, float32 x with kernels built without AVX-512, and at least
    MIN_ROWS rows (MIN_ROWS_MANY_SLABS for a weight of several slabs: an LM head); fewer rows, and
    the other builds and CPUs, keep the tiled GEMM."""
    from tram.model.quant import slab_gemm

    monkeypatch.setattr(slab_gemm, "bf16_gemm_fast", lambda: True)
    mlp, head = (4864, 896), (151936, 896)
    avx2, avx512 = _Build(256), _Build(512)

    def wants(rows: int, shape: tuple[int, int], dtype: torch.dtype = torch.bfloat16, build=avx512) -> bool:
        return slab_gemm.wants_slabs(torch.empty(rows, shape[1], dtype=dtype), *shape, build)

    assert (slab_gemm.MIN_ROWS, slab_gemm.MIN_ROWS_MANY_SLABS) == (32, 128)
    assert not wants(31, mlp) and wants(32, mlp)
    assert not wants(127, head) and wants(128, head)
    assert not wants(2048, mlp, torch.float32)  # AVX-512: the tiled GEMM keeps float32
    assert not wants(31, mlp, torch.float32, avx2) and wants(32, mlp, torch.float32, avx2)
    assert not wants(127, head, torch.float32, avx2) and wants(128, head, torch.float32, avx2)
    assert not wants(2048, mlp, torch.float16, avx2)
    monkeypatch.setattr(slab_gemm, "bf16_gemm_fast", lambda: False)
    assert not wants(2048, mlp) and not wants(2048, mlp, build=avx2)


def test_bf16_without_native_bf16_gemms_keeps_the_float32_tiled_gemm(monkeypatch):
    """Where oneDNN has no bf16 GEMM (AVX2 CPUs), PyTorch's bf16 F.linear is slower than float32: the
    tiled GEMM keeps the rows, bit for bit what gguf_gemm gives."""
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available")
    from tram.model.quant import slab_gemm

    monkeypatch.setattr(slab_gemm, "bf16_gemm_fast", lambda: False)
    qw = GGUFWeight(_blocks(Q4_K, 70, 256, 12), Q4_K, 256)
    x = torch.randn(40, 256).bfloat16()
    with torch.inference_mode():
        kernels = weights._kernels(x)
        assert torch.equal(qw.apply(x, None), kernels.gguf_gemm(x, qw.data, Q4_K, None))


@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_embedding_is_rows_of_the_dequantized_weight(ggml_type: int):
    qw = GGUFWeight(_blocks(ggml_type, 40, 256, 7), ggml_type, 256)
    ids = torch.tensor([3, 0, 39, 3, 17])
    full = qw.dequantize()
    for dtype in (torch.float32, torch.bfloat16):
        with torch.inference_mode():
            got = qw.embedding(ids, dtype)
        assert got.dtype == dtype and torch.equal(got, full[ids].to(dtype))
    assert torch.equal(qw.embedding(ids.view(1, 5)), full[ids].view(1, 5, 256))  # no kernels under autograd


def test_without_the_kernels_the_reference_path_runs(monkeypatch):
    qw = GGUFWeight(_blocks(Q4_K, 64, 256, 3), Q4_K, 256)
    x = torch.randn(2, 256)
    monkeypatch.setattr(weights, "kernels_for", lambda x: None)
    with torch.inference_mode():
        assert torch.equal(qw.apply(x, None), reference_linear(x, qw, None))
        assert torch.equal(qw.embedding(torch.tensor([5, 1])), qw.dequantize()[[5, 1]])


def test_nbytes_and_bad_types_and_shapes():
    data = _blocks(Q6_K, 4, 512, 0)
    qw = GGUFWeight(data, Q6_K, 512)
    assert (qw.out_features, qw.in_features, qw.ggml_type, qw.nbytes) == (4, 512, Q6_K, 4 * 2 * 210)
    with pytest.raises(ValueError, match="GGUF Q2_K .* is not kept quantized: the kept types are"):
        GGUFWeight(data, int(gguf.GGMLQuantizationType.Q2_K), 512)
    with pytest.raises(ValueError, match="multiple of 256 weights, not in_features=480"):
        GGUFWeight(data[:, :420], Q6_K, 480)
    with pytest.raises(ValueError, match="rows of 256 weights are 210 bytes, got 420"):
        GGUFWeight(data, Q6_K, 256)
    with pytest.raises(ValueError, match="2-D uint8"):
        GGUFWeight(data.view(torch.int8), Q6_K, 512)
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize_gguf(_blocks(Q8_0, 2, 96, 0), Q8_0, 80)
