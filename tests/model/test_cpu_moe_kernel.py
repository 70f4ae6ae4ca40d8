"""The CPU fused mixture-of-experts kernel (csrc/fused_moe.cpp) against a plain PyTorch reference:
per expert, gather its tokens, two float32 matmuls, the activation, a weighted index_add."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from moe_oracle import reference_moe

from tram.model.gguf.weight import BLOCK_SIZES, Q4_K, Q5_K, Q6_K, Q8_0, dequantize_activations, dequantize_gguf
from tram.model.kernels.cpu_kernels import cpu_kernels_available
from tram.model.layers.moe import cpu_kernel
from tram.model.layers.moe.cpu_kernel import cpu_fused_moe
from tram.model.layers.moe.experts import ExpertWeights
from tram.model.quant.checkpoint_weight import CheckpointInt4Weight
from tram.model.quant.weights import Int4Weight, Int8Weight, unpack_int4

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ CPU kernels did not build")

# (E, k, H, I)
SHAPES = [(8, 2, 64, 96), (16, 4, 256, 128)]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.inference_mode():  # as the model runs; under autograd the kernel declines
        yield


def routing(T: int, E: int, k: int, seed: int, drop: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(T, E, generator=g)
    weights, ids = scores.softmax(-1).topk(k, dim=-1)
    ids = ids.to(torch.int32)
    if drop:  # experts on another rank: every third slot, and all of token 0's
        ids[torch.arange(T * k).view(T, k) % 3 == 1] = -1
        ids[0] = -1
    return ids, weights.float()


def float_weights(E: int, H: int, I: int, seed: int, bias: bool, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I**0.5).to(dtype)
    b13 = (torch.randn(E, 2 * I, generator=g) * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(E, H, generator=g) * 0.1).to(dtype) if bias else None
    return w13, w2, b13, b2


def quantized(w: torch.Tensor, kind: str, group: int = 32) -> tuple[ExpertWeights, torch.Tensor]:
    """The stacked format of w [E, N, K] and the dequantized weights it stands for."""
    E, N, K = w.shape
    if kind == "float":
        return ExpertWeights("float", w.contiguous(), N, K), w
    if kind == "int4-zero":  # a checkpoint's asymmetric int4 (AWQ): random zero points per group
        g = torch.Generator().manual_seed(N * K)
        per = []
        for e in range(E):
            base = Int4Weight(w[e], group)
            zero = torch.randint(0, 16, base.scale.shape, generator=g).to(torch.uint8)
            per.append(CheckpointInt4Weight(unpack_int4(base.qweight), base.scale, group, zero))
    else:
        per = [Int8Weight(w[e]) if kind == "int8" else Int4Weight(w[e], group) for e in range(E)]
    data = torch.stack([p.qweight for p in per]).contiguous()
    scale = torch.stack([p.scale for p in per]).contiguous()
    zero = torch.stack([p.zero for p in per]).contiguous() if kind == "int4-zero" else None
    deq = torch.stack([p.dequantize(torch.float32) for p in per])
    stacked_kind = kind.removesuffix("-zero")
    group = group if stacked_kind == "int4" else 0
    return ExpertWeights(stacked_kind, data, N, K, scale=scale, zero=zero, group=group), deq


def assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    scale = ref.float().abs().max().item() + 1e-30
    torch.testing.assert_close(out.float(), ref.float(), rtol=rel, atol=rel * scale)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T", [1, 3, 40])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_matches_the_reference(shape, T, activation, bias):
    E, k, H, I = shape
    x = torch.randn(T, H)
    ids, weights = routing(T, E, k, seed=T)
    w13, w2, b13, b2 = float_weights(E, H, I, seed=1, bias=bias)
    out = cpu_fused_moe(x, ids, weights, quantized(w13, "float")[0], quantized(w2, "float")[0], b13, b2, activation)
    assert_close(out, reference_moe(x, ids, weights, w13, w2, b13, b2, activation), 1e-5)


@pytest.mark.parametrize("T", [1, 3, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_matches_the_reference(T, bias):
    E, k, H, I = SHAPES[1]
    x = torch.randn(T, H).bfloat16()
    ids, weights = routing(T, E, k, seed=T)
    w13, w2, b13, b2 = float_weights(E, H, I, seed=2, bias=bias, dtype=torch.bfloat16)
    out = cpu_fused_moe(x, ids, weights, quantized(w13, "float")[0], quantized(w2, "float")[0], b13, b2, "silu")
    assert_close(out, reference_moe(x, ids, weights, w13, w2, b13, b2, "silu"), 1e-2)


@pytest.mark.parametrize("kind", ["int8", "int4", "int4-zero"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T", [1, 3, 40])
def test_quantized_match_the_dequantized_reference(kind, shape, T):
    E, k, H, I = shape
    x = torch.randn(T, H)
    ids, weights = routing(T, E, k, seed=T + 7)
    w13, w2, b13, b2 = float_weights(E, H, I, seed=3, bias=T == 3)
    f13, d13 = quantized(w13, kind)
    f2, d2 = quantized(w2, kind)
    out = cpu_fused_moe(x, ids, weights, f13, f2, b13, b2, "swiglu_oai" if T == 40 else "silu")
    ref = reference_moe(x, ids, weights, d13, d2, b13, b2, "swiglu_oai" if T == 40 else "silu")
    assert_close(out, ref, 1e-5)


def gguf_blocks(ggml_type: int, rows: int, k: int, seed: int) -> torch.Tensor:
    """[rows, row_bytes] random blocks with finite, small fp16 scales (every quant bit pattern is valid)."""
    g = np.random.default_rng(seed)
    block, size = BLOCK_SIZES[ggml_type]
    raw = g.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    offsets = {Q8_0: (0,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,)}[ggml_type]
    for off in offsets:
        d = (g.standard_normal((rows, k // block, 1)) * (0.05 / block if block == 256 else 0.05 / 8)).astype(np.float16)
        raw[..., off : off + 2] = d.view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1))


def gguf_weight(
    ggml_type: int, E: int, N: int, K: int, seed: int, int8_activations: bool = False
) -> tuple[ExpertWeights, torch.Tensor]:
    data = torch.stack([gguf_blocks(ggml_type, N, K, seed + e) for e in range(E)]).contiguous()
    deq = torch.stack([dequantize_gguf(data[e], ggml_type, K) for e in range(E)])
    return ExpertWeights("gguf", data, N, K, ggml_type=ggml_type, int8_activations=int8_activations), deq


@pytest.mark.parametrize("types", [(Q8_0, Q8_0), (Q4_K, Q6_K)])
@pytest.mark.parametrize("T", [2, 24])
def test_gguf_matches_the_dequantized_reference(types, T):
    E, k, H, I = (8, 2, 64, 96) if types[0] == Q8_0 else (4, 2, 256, 256)
    x = torch.randn(T, H)
    ids, weights = routing(T, E, k, seed=T)
    f13, d13 = gguf_weight(types[0], E, 2 * I, H, seed=10)
    f2, d2 = gguf_weight(types[1], E, H, I, seed=50)
    out = cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu")
    assert_close(out, reference_moe(x, ids, weights, d13, d2, None, None, "silu"), 1e-5)


def reference_moe_int8(x, ids, weights, w13, w2) -> torch.Tensor:
    """reference_moe with each projection's input quantized to int8 per 256 values (llama.cpp's Q8_K)
    and multiplied back, as the K-quants' int8 activations are."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(w13.shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        gate, up = (dequantize_activations(x[t].float(), 256) @ w13[e].T).chunk(2, dim=-1)
        y = dequantize_activations(F.silu(gate) * up, 256) @ w2[e].T
        out.index_add_(0, t, y * weights[t, j, None])
    return out.to(x.dtype)


@pytest.mark.parametrize("types", [(Q4_K, Q6_K), (Q5_K, Q4_K)])
@pytest.mark.parametrize("T", [1, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_k_quants_with_int8_activations_match_the_quantized_reference(types, T, dtype):
    """The activations' grid makes a rounding difference of the gate/up sums a whole int8 step of the
    down projection's input now and then, so the bound is a step's share of the output, not float32's."""
    E, k, H, I = 4, 2, 512, 256
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).to(dtype)
    ids, weights = routing(T, E, k, seed=T)
    f13, d13 = gguf_weight(types[0], E, 2 * I, H, seed=10, int8_activations=True)
    f2, d2 = gguf_weight(types[1], E, H, I, seed=50, int8_activations=True)
    assert cpu_kernel.takes_int8_activations(f13, f2)
    out = cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu")
    assert_close(out, reference_moe_int8(x, ids, weights, d13, d2), 2e-3 if dtype == torch.float32 else 1e-2)
    # Float activations: further away, by what quantizing silu(gate) * up per 256 costs (a heavy-tailed
    # block's largest value sets a coarse step): up to 6.6% of the largest output over 40 draws of x.
    exact = reference_moe(x, ids, weights, d13, d2, None, None, "silu")
    assert (out.float() - exact.float()).abs().max() < 0.1 * exact.float().abs().max()


def test_k_quants_with_int8_activations_are_the_same_for_any_batch():
    """Integer products at every token count (no switch to a float GEMM past 8 tokens an expert), so a
    token's output is bit for bit the same alone and in a batch that crowds its experts."""
    E, k, H, I = 4, 2, 256, 256
    x = torch.randn(40, H)
    ids, weights = routing(40, E, k, seed=7)
    f13, _ = gguf_weight(Q4_K, E, 2 * I, H, seed=11, int8_activations=True)
    f2, _ = gguf_weight(Q6_K, E, H, I, seed=12, int8_activations=True)
    together = cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu")
    for t in (0, 17, 39):
        alone = cpu_fused_moe(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], f13, f2, None, None, "silu")
        assert torch.equal(alone, together[t : t + 1])
    q8, _ = gguf_weight(Q8_0, E, H, I, seed=12, int8_activations=True)
    assert not cpu_kernel.takes_int8_activations(f13, q8)  # Q8_0 with int8 activations: the grouped path


@pytest.mark.parametrize("T", [1, 5, 40])
def test_slots_on_other_ranks_are_skipped(T):
    E, k, H, I = SHAPES[0]
    x = torch.randn(T, H)
    ids, weights = routing(T, E, k, seed=3, drop=True)
    w13, w2, b13, b2 = float_weights(E, H, I, seed=4, bias=True)
    out = cpu_fused_moe(x, ids, weights, quantized(w13, "float")[0], quantized(w2, "float")[0], b13, b2, "silu")
    assert_close(out, reference_moe(x, ids, weights, w13, w2, b13, b2, "silu"), 1e-5)
    assert torch.count_nonzero(out[0]) == 0  # token 0 has no expert here


@pytest.mark.parametrize("kind,dtype", [("float", torch.float32), ("float", torch.bfloat16), ("int4", torch.float32)])
def test_independent_of_the_thread_count(kind, dtype):
    E, k, H, I = SHAPES[1]
    x = torch.randn(40, H).to(dtype)
    ids, weights = routing(40, E, k, seed=5)
    ids[:3] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)  # experts 0-3 with many tokens, others few
    w13, w2, b13, b2 = float_weights(E, H, I, seed=6, bias=True, dtype=dtype if kind == "float" else torch.float32)
    f13, f2 = quantized(w13, kind)[0], quantized(w2, kind)[0]
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs += [cpu_fused_moe(x[:m], ids[:m], weights[:m], f13, f2, b13, b2, "silu") for m in (2, 40)]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])


def test_long_inputs_go_through_in_pieces(monkeypatch):
    monkeypatch.setattr(cpu_kernel, "MAX_TOKENS_PER_CALL", 16)
    E, k, H, I = SHAPES[0]
    x = torch.randn(40, H)
    ids, weights = routing(40, E, k, seed=8, drop=True)
    w13, w2, b13, b2 = float_weights(E, H, I, seed=9, bias=True)
    out = cpu_fused_moe(x, ids, weights, quantized(w13, "float")[0], quantized(w2, "float")[0], b13, b2, "silu")
    assert_close(out, reference_moe(x, ids, weights, w13, w2, b13, b2, "silu"), 1e-5)


def test_unsupported_inputs_fall_back():
    E, k, H, I = SHAPES[0]
    ids, weights = routing(2, E, k, seed=0)
    w13, w2, _, _ = float_weights(E, H, I, seed=0, bias=False)
    f13, f2 = quantized(w13, "float")[0], quantized(w2, "float")[0]
    x = torch.randn(2, H)
    assert cpu_fused_moe(x.half(), ids, weights, f13, f2, None, None, "silu") is None  # fp16 x
    assert cpu_fused_moe(x.bfloat16(), ids, weights, f13, f2, None, None, "silu") is None  # weights not x's dtype
    assert cpu_fused_moe(x, ids, weights, f13, f2, None, None, "gelu") is None
    f16 = ExpertWeights("gguf", torch.zeros(E, 2 * I, 2 * H, dtype=torch.uint8), 2 * I, H, ggml_type=1)
    assert cpu_fused_moe(x, ids, weights, f16, f2, None, None, "silu") is None
    with torch.inference_mode(False), torch.enable_grad():
        assert cpu_fused_moe(x, ids, weights, f13, f2, None, None, "silu") is None


def _pytorch_route(logits: torch.Tensor, k: int, softmax_first: bool, renormalize: bool):
    """select_experts' PyTorch path (what transformers computes)."""
    logits = logits.float()
    if not softmax_first:
        values, ids = torch.topk(logits, k, dim=-1)
        return torch.softmax(values, dim=-1), ids
    values, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    return (values / values.sum(-1, keepdim=True) if renormalize else values), ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scoring", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("T,E,k", [(1, 128, 8), (7, 8, 2), (300, 32, 4)])  # 300 x 32: rows split over threads
def test_the_router_kernel_chooses_as_pytorch_does(dtype, scoring, T, E, k):
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    logits = (torch.randn(T, E, generator=torch.Generator().manual_seed(T + E)) * 3).to(dtype)
    weights, ids = load_cpu_kernels().moe_route(logits, k, *scoring)
    want_w, want_ids = _pytorch_route(logits, k, *scoring)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (T, k)
    # The same experts, or where logits tie (bfloat16 has few values), experts of the same logits.
    assert torch.equal(logits.gather(1, ids.long()), logits.gather(1, want_ids))
    if dtype == torch.float32:
        assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_w, rtol=2e-6, atol=1e-7)


def test_the_router_kernel_breaks_ties_by_expert_id_and_puts_nan_last():
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    logits = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 3.0, 0.0]])
    weights, ids = load_cpu_kernels().moe_route(logits, 4, False, False)
    assert ids.tolist() == [[1, 2, 4, 0]]
    assert torch.isfinite(weights).all() and abs(weights.sum().item() - 1) < 1e-6
    with pytest.raises(RuntimeError, match="top_k"):
        load_cpu_kernels().moe_route(logits, 7, True, True)
