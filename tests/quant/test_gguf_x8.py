"""Q4_K, Q6_K, Q5_0 and Q8_0 weights repacked eight rows at a time (csrc/gguf_x8.h): the repack loses
nothing, the product with int8 activations matches the PyTorch reference and is one numerics for every batch,
thread count and token count, in the linear and (the K-quants) in the fused MoE kernel; the loader
repacks where the build prefers it. These run on every machine with the kernels (the layouts need AVX2
only), whichever layout the model loader would choose there."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import assert_batch_and_thread_invariant, assert_close_to_reference
from test_gguf_weights import _blocks

from tram.model.gguf.weight import (
    BLOCK_SIZES_ALL,
    Q4_K,
    Q4_K_X8,
    Q5_0,
    Q5_0_X8,
    Q6_K,
    Q6_K_X8,
    Q8_0,
    Q8_0_X8,
    GGUFWeight,
    reference_linear_int8,
    repack_for_int8,
)
from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels
from tram.model.layers.moe import cpu_kernel
from tram.model.layers.moe.cpu_kernel import cpu_fused_moe
from tram.model.layers.moe.experts import ExpertWeights

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ CPU kernels did not build")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.inference_mode():
        yield


def _x(rows: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0, :256] = 0  # a whole block of zeros: scale 0
    x[-1, 32:64] *= 1e3  # a loud sub-block beside quiet ones
    return x


# file type, repacked type, bytes per row and block
LAYOUTS = [(Q4_K, Q4_K_X8, 156), (Q6_K, Q6_K_X8, 210), (Q5_0, Q5_0_X8, 22), (Q8_0, Q8_0_X8, 34)]
IDS = ["Q4_K", "Q6_K", "Q5_0", "Q8_0"]


def _packed(ggml_type: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = _blocks(ggml_type, n, k, seed)
    return data, load_cpu_kernels().gguf_x8_pack(data, ggml_type)


@pytest.mark.parametrize("ggml_type, x8, row_bytes", LAYOUTS, ids=IDS)
def test_the_repack_is_lossless_and_keeps_n_rows(ggml_type: int, x8: int, row_bytes: int):
    data, packed = _packed(ggml_type, 24, 768, 1)
    assert packed.shape == (24, 768 // BLOCK_SIZES_ALL[x8][0] * row_bytes) and packed.dtype == torch.uint8
    assert load_cpu_kernels().gguf_x8_type(ggml_type) == x8
    assert torch.equal(load_cpu_kernels().gguf_x8_unpack(packed, x8), data)
    w = GGUFWeight(packed, x8, 768, int8_activations=True)
    assert w.file_type == ggml_type and w.nbytes == packed.numel()
    assert torch.equal(w.dequantize(), GGUFWeight(data, ggml_type, 768).dequantize())
    ids = torch.tensor([[5, 23], [0, 8]])
    assert torch.equal(w.embedding(ids), GGUFWeight(data, ggml_type, 768).embedding(ids))


def test_bad_shapes_are_refused():
    kernels = load_cpu_kernels()
    with pytest.raises(RuntimeError, match="12 rows is not a multiple of 8"):
        kernels.gguf_x8_pack(_blocks(Q4_K, 12, 256, 0), Q4_K)
    with pytest.raises(RuntimeError, match="type -1 is not a repacked layout"):
        kernels.gguf_x8_pack(_blocks(Q4_K, 8, 256, 0), 13)  # Q5_K has no repacked layout
    with pytest.raises(ValueError, match="groups of 8 rows, not 12"):
        GGUFWeight(torch.zeros(12, 156, dtype=torch.uint8), Q4_K_X8, 256, int8_activations=True)
    _, packed = _packed(Q4_K, 8, 512, 0)
    with pytest.raises(RuntimeError, match="expected 156 for K = 256"):
        kernels.gguf_linear_int8(torch.randn(1, 256), packed, Q4_K_X8)


@pytest.mark.parametrize("ggml_type, x8, row_bytes", LAYOUTS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_product_matches_the_int8_reference(ggml_type: int, x8: int, row_bytes: int, dtype: torch.dtype):
    shapes = ((8, 256), (40, 1024), (64, 2048)) + (((16, 608),) if ggml_type in (Q5_0, Q8_0) else ())  # 19 blocks
    for n, k in shapes:
        _, packed = _packed(ggml_type, n, k, n + k)
        w = GGUFWeight(packed, x8, k, int8_activations=True)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
        for rows in (1, 2, 3, 5, 17, 70):
            x = _x(rows, k, rows).to(dtype)
            got, want = w.apply(x, bias), reference_linear_int8(x, w, bias)
            assert got.shape == (rows, n)
            assert_close_to_reference(got, want, dtype)


@pytest.mark.parametrize("ggml_type, x8, row_bytes", LAYOUTS, ids=IDS)
def test_one_numerics_for_every_batch_thread_count_and_row_count(ggml_type: int, x8: int, row_bytes: int):
    _, packed = _packed(ggml_type, 96, 512, 5)
    w = GGUFWeight(packed, x8, 512, int8_activations=True)
    assert_batch_and_thread_invariant(lambda x: w.apply(x, None), _x(16, 512, 4))
    x = _x(150, 512, 6)  # past 64 rows: a second pass over the groups
    together = w.apply(x, None)
    assert torch.equal(w.apply(x[100:101], None), together[100:101])
    assert torch.equal(w.apply(x[60:75], None), together[60:75])


def test_qkv_in_one_call_take_the_repacked_weights_too():
    kernels = load_cpu_kernels()
    x = _x(3, 512, 1)
    _, q = _packed(Q4_K, 32, 512, 1)
    _, k = _packed(Q6_K, 16, 512, 3)
    v = _blocks(Q6_K, 16, 512, 2)
    ys = kernels.gguf_linear_int8_n(x, [q, k, v], [Q4_K_X8, Q6_K_X8, Q6_K], [None, None, None])
    assert torch.equal(ys[0], kernels.gguf_linear_int8(x, q, Q4_K_X8))
    assert torch.equal(ys[1], kernels.gguf_linear_int8(x, k, Q6_K_X8))
    assert torch.equal(ys[2], kernels.gguf_linear_int8(x, v, Q6_K))


@pytest.mark.parametrize("rows", [1, 3, 70])
def test_32_k_layouts_in_one_call_each_as_alone(rows: int):
    """q/k/v on Q5_0 x8 and Q8_0 x8 share one parallel region; beside a file-layout Q8_0 or a K-quant (x
    quantized per 256 k) each weight is its own call. Every output is the one a call of its own gives."""
    kernels = load_cpu_kernels()
    x = _x(rows, 512, rows)
    q, k = _packed(Q5_0, 32, 512, 1)[1], _packed(Q5_0, 16, 512, 2)[1]
    v, q4 = _packed(Q8_0, 16, 512, 5)[1], _packed(Q4_K, 16, 512, 4)[1]
    neighbours = [(k, Q5_0_X8), (v, Q8_0_X8), (_blocks(Q8_0, 16, 512, 3), Q8_0), (q4, Q4_K_X8)]
    alone_q = kernels.gguf_linear_int8(x, q, Q5_0_X8)
    for other, other_type in neighbours:
        ys = kernels.gguf_linear_int8_n(x, [q, other], [Q5_0_X8, other_type], [None, None])
        assert torch.equal(ys[0], alone_q)
        assert torch.equal(ys[1], kernels.gguf_linear_int8(x, other, other_type))


def test_the_loader_repacks_where_the_build_prefers_it(monkeypatch):
    data = _blocks(Q4_K, 16, 256, 3)
    got, qtype = repack_for_int8(data, Q4_K)
    kernels = load_cpu_kernels()
    if kernels.gguf_x8_preferred(Q4_K):
        assert qtype == Q4_K_X8 and torch.equal(kernels.gguf_x8_unpack(got, Q4_K_X8), data)
    else:
        assert qtype == Q4_K and got is data
    q6 = _blocks(Q6_K, 16, 256, 3)
    assert repack_for_int8(q6, Q6_K)[1] == (Q6_K_X8 if kernels.gguf_x8_preferred(Q6_K) else Q6_K)
    assert not kernels.gguf_x8_preferred(13)  # Q5_K: no repacked layout
    q5 = _blocks(Q5_0, 16, 256, 3)
    assert repack_for_int8(q5, Q5_0)[1] == (Q5_0_X8 if kernels.gguf_x8_preferred(Q5_0) else Q5_0)
    assert repack_for_int8(q5, Q5_0, experts=True)[1] == Q5_0  # the fused MoE kernel takes K-quant layouts
    stacked = torch.stack([data, data])  # experts [E, N, row_bytes]
    got3, _ = repack_for_int8(stacked, Q4_K)
    assert got3.shape[:2] == (2, 16) and torch.equal(got3[0], got3[1])
    assert repack_for_int8(data[:12], Q4_K)[1] == Q4_K  # not whole groups
    assert repack_for_int8(_blocks(13, 16, 256, 3), 13)[1] == 13  # Q5_K: no repacked layout
    monkeypatch.setenv("TRAM_GGUF_REPACK", "0")
    assert repack_for_int8(data, Q4_K) == (data, Q4_K)


def _experts(
    E: int, N: int, K: int, seed: int, packed: bool, ggml_type: int = Q4_K
) -> tuple[ExpertWeights, torch.Tensor]:
    data = torch.stack([_blocks(ggml_type, N, K, seed + e) for e in range(E)]).contiguous()
    deq = torch.stack([GGUFWeight(data[e], ggml_type, K).dequantize() for e in range(E)])
    qtype = ggml_type
    if packed:
        data = load_cpu_kernels().gguf_x8_pack(data.view(E * N, -1), ggml_type).view(E, N, -1)
        qtype = load_cpu_kernels().gguf_x8_type(ggml_type)
    return ExpertWeights("gguf", data, N, K, ggml_type=qtype, int8_activations=True), deq


def _routing(T: int, E: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    return ids, torch.rand(T, k, generator=g)


@pytest.mark.parametrize("down", [Q4_K, Q6_K], ids=IDS[:2])
@pytest.mark.parametrize("T", [1, 24])
def test_fused_moe_on_repacked_experts_matches_the_file_layout(T: int, down: int):
    """The same weights in either layout: the same products up to the float steps' order (each layout
    has its own), far inside what quantizing the activations costs."""
    E, k, H, I = 4, 2, 512, 256
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(T))
    ids, weights = _routing(T, E, k, seed=T)
    p13, _ = _experts(E, 2 * I, H, 10, packed=True)
    p2, _ = _experts(E, H, I, 50, packed=True, ggml_type=down)
    f13, _ = _experts(E, 2 * I, H, 10, packed=False)
    f2, _ = _experts(E, H, I, 50, packed=False, ggml_type=down)
    assert cpu_kernel.takes_int8_activations(p13, p2)
    got = cpu_fused_moe(x, ids, weights, p13, p2, None, None, "silu")
    want = cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu")
    torch.testing.assert_close(got, want, atol=2e-3 * want.abs().max().item(), rtol=0)
    # and each expert's projection through its own view (the grouped path's) as the kernel computes it
    gate_up = p13.views()[int(ids[0, 0])].apply(x[:1], None)
    assert gate_up.shape == (1, 2 * I)


@pytest.mark.parametrize("down", [Q4_K, Q6_K], ids=IDS[:2])
def test_fused_moe_on_repacked_experts_is_the_same_for_any_batch(down: int):
    """40 tokens on 4 experts: ~20 each, past the AVX-512 GEMM's threshold for Q4_K x8; one alone: the
    x8 kernel. The same bits either way."""
    E, k, H, I = 4, 2, 256, 256
    x = torch.randn(40, H)
    ids, weights = _routing(40, E, k, seed=7)
    p13, _ = _experts(E, 2 * I, H, 11, packed=True)
    p2, _ = _experts(E, H, I, 12, packed=True, ggml_type=down)
    together = cpu_fused_moe(x, ids, weights, p13, p2, None, None, "silu")
    for t in (0, 17, 39):
        alone = cpu_fused_moe(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], p13, p2, None, None, "silu")
        assert torch.equal(alone, together[t : t + 1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(cpu_fused_moe(x, ids, weights, p13, p2, None, None, "silu"), together)
    finally:
        torch.set_num_threads(threads)


def test_fused_moe_refuses_repacked_gate_up_rows_that_split_a_group():
    E, H, I = 2, 256, 12  # 2I = 24 rows: whole groups, but the gate's 12 are not
    p13, _ = _experts(E, 2 * I, H, 1, packed=True)
    p2, _ = _experts(E, H, 256, 2, packed=True)
    kernels = load_cpu_kernels()
    ids, weights = _routing(2, E, 1, seed=0)
    weights_and_options = (p13.data, None, 4, Q4_K_X8, p2.data, None, 4, Q4_K_X8, None, None, 0, 1.702, 7.0, None, None)
    with pytest.raises(RuntimeError, match="intermediate size a multiple of 8"):
        kernels.fused_moe(torch.randn(2, H), ids, weights, *weights_and_options)
