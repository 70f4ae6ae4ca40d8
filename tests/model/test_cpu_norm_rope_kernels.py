"""The C++ RMSNorm and rotary kernels (tram/model/kernels/csrc/rms_norm.cpp, rotary.cpp) against the PyTorch
code they replace on CPU, which follows transformers' roundings.

Rotary must be bitwise equal (each product and sum rounded as PyTorch rounds them). RMSNorm may differ
only by the order of its sum of squares: within a couple of float32 ulps, and usually equal in 16 bits.
"""

from __future__ import annotations

import pytest
import torch

from tram.model.kernels.cpu_kernels import kernels_for, load_cpu_kernels
from tram.model.layers.norm import Float32WeightRMSNorm, GemmaRMSNorm, RMSNorm
from tram.model.layers.rope import apply_rotary, apply_rotary_qk

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def kernels():
    module = load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build (see the warning log)"
    return module


def reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def cos_sin(tokens: int, rotary_dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.randn(tokens, rotary_dim // 2, generator=torch.Generator().manual_seed(seed)) * 10
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)  # [T, 1, R]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 288), (5, 768), (33, 100), (2, 7)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_rms_norm_matches_pytorch(kernels, shape: tuple[int, int], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    residual = torch.randn(*shape, generator=g).to(dtype)
    weight = torch.randn(shape[1], generator=g).to(dtype)
    ref = reference_norm(x, weight, 1e-5)
    out = kernels.rms_norm(x, weight, 1e-5)
    tol = 2e-6 if dtype == torch.float32 else 1e-2  # a float32 ulp or two; one 16-bit ulp at worst
    assert out.dtype == dtype and torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol)
    normed, summed = kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, residual + x)
    assert torch.allclose(normed.float(), reference_norm(residual + x, weight, 1e-5).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_float_weight_rounds_once(kernels, dtype: torch.dtype) -> None:
    """A float32 weight multiplies the float32 normalised row, rounded once (Gemma's, OLMo 2's)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 640, generator=g) * 3).to(dtype)
    weight = torch.randn(640, generator=g)
    x32 = x.float()
    ref = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(dtype)
    out = kernels.rms_norm(x, weight, 1e-6)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    assert out.dtype == dtype and torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol)
    if dtype != torch.float32:  # rounding the normalised row first (Llama's) is another function
        llama = kernels.rms_norm(x, weight.to(dtype), 1e-6)
        assert (out != llama).any() and (out.float() - ref.float()).abs().max() < (
            llama.float() - ref.float()
        ).abs().max()


def test_rms_norm_rows_independent_of_batch(kernels) -> None:
    x, weight = torch.randn(9, 288), torch.randn(288)
    batched = kernels.rms_norm(x, weight, 1e-6)
    for i in range(9):
        assert torch.equal(kernels.rms_norm(x[i : i + 1], weight, 1e-6)[0], batched[i])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,rotary_dim",
    [(6, 6, 48, 48), (8, 2, 64, 32), (4, 4, 8, 8), (2, 1, 128, 128), (3, 1, 40, 24)],
)
def test_rotary_bitwise_equal_to_pytorch(kernels, dtype, heads, kv_heads, head_dim, rotary_dim) -> None:
    tokens = 7
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    q = torch.randn(tokens, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=g).to(dtype)
    cos, sin = cos_sin(tokens, rotary_dim, dtype, seed=rotary_dim)
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    with torch.inference_mode():
        got_q, got_k = apply_rotary_qk(q.clone(), k.clone(), cos, sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rotary_16_bit_rounding_across_scales(kernels, dtype) -> None:
    # The bf16 path rounds 8 lanes at a time with integer arithmetic: magnitudes from subnormal to
    # overflow, signed zeros, infinities and NaN must round (and propagate) as PyTorch's ops do.
    tokens, heads, head_dim = 64, 4, 32
    g = torch.Generator().manual_seed(5)
    scale = torch.logspace(-42, 38, tokens, base=10.0).view(tokens, 1, 1)
    q = (torch.randn(tokens, heads, head_dim, generator=g) * scale).to(dtype)
    k = (torch.randn(tokens, 1, head_dim, generator=g) * scale).to(dtype)
    q[0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")])
    k[1, 0, 3] = float("nan")
    cos, sin = cos_sin(tokens, head_dim, dtype, seed=9)
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    with torch.inference_mode():
        got_q, got_k = apply_rotary_qk(q.clone(), k.clone(), cos, sin)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert torch.equal(got.isnan(), want.isnan())
        finite = ~want.isnan()  # NaN's payload may differ; every other value, signed zeros too, bit for bit
        assert torch.equal(got.view(torch.int16)[finite], want.view(torch.int16)[finite])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_in_place_on_column_slices_of_one_projection(kernels, dtype) -> None:
    """q and k as column slices of one [T, (H + 2 Hkv) D] q/k/v output (tokens a row apart, each
    token's heads contiguous): the kernel rotates them in place, bit for bit as on contiguous copies,
    and leaves v's columns alone."""
    tokens, heads, kv_heads, head_dim = 5, 4, 2, 16
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    v_before = v.clone()
    cos, sin = cos_sin(tokens, head_dim, dtype, seed=3)
    want_q, want_k = apply_rotary(q.contiguous(), cos, sin), apply_rotary(k.contiguous(), cos, sin)
    with torch.inference_mode():
        got_q, got_k = apply_rotary_qk(q, k, cos, sin)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # the kernel ran, in place
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and torch.equal(v, v_before)


def test_rotary_falls_back_for_strided_or_autograd_inputs() -> None:
    q, k = torch.randn(3, 4, 16), torch.randn(3, 2, 16)
    cos, sin = cos_sin(3, 16, torch.float32, seed=0)
    strided = torch.randn(3, 4, 32)[..., ::2]
    with torch.inference_mode():
        out_q, _ = apply_rotary_qk(strided, k.clone(), cos, sin)
    assert torch.equal(out_q, apply_rotary(strided, cos, sin))
    q_grad = q.clone().requires_grad_(True)
    out_q, out_k = apply_rotary_qk(q_grad, k, cos, sin)  # autograd on: the PyTorch path, q untouched
    assert out_q.requires_grad and torch.equal(out_q.detach(), apply_rotary(q, cos, sin))
    assert kernels_for(q_grad) is None
    # tokens sharing memory (an expanded row): rotating in place would rotate it once per token
    shared = torch.randn(1, 4, 16).expand(3, 4, 16)
    with torch.inference_mode():
        out_q, _ = apply_rotary_qk(shared, k.clone(), cos, sin)
    assert torch.equal(out_q, apply_rotary(shared, cos, sin))


def test_rms_norm_module_paths_agree() -> None:
    norm = RMSNorm(64, 1e-5, torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x, residual = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    with torch.inference_mode():
        fast = norm(x)
        fast_normed, fast_sum = norm.add_forward(x, residual)
    slow = norm(x)  # autograd enabled: PyTorch ops
    slow_normed, slow_sum = norm.add_forward(x, residual)
    assert torch.allclose(fast.float(), slow.float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(fast_sum, slow_sum)
    assert torch.allclose(fast_normed.float(), slow_normed.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [GemmaRMSNorm, Float32WeightRMSNorm], ids=lambda c: c.__name__)
def test_float_weight_norm_modules_paths_agree(cls: type[torch.nn.Module], dtype: torch.dtype) -> None:
    """Gemma's (1 + w) and OLMo 2's float32-weight norms: the kernel against their PyTorch ops, on rows
    of 3-D input (Gemma's per-head q/k norms); a weight loaded again is picked up."""
    norm = cls(64, 1e-6, dtype)
    x = (torch.randn(3, 4, 64) * 2).to(dtype)
    for _ in range(2):
        with torch.no_grad():
            norm.weight.copy_(torch.randn(64))
        with torch.inference_mode():
            fast = norm(x if cls is GemmaRMSNorm else x.view(12, 64))
        slow = norm(x if cls is GemmaRMSNorm else x.view(12, 64))  # autograd enabled: PyTorch ops
        tol = 2e-6 if dtype == torch.float32 else 1e-2
        assert fast.shape == slow.shape and torch.allclose(fast.float(), slow.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_add_is_the_three_calls_it_replaces(kernels, dtype: torch.dtype) -> None:
    """Gemma's sandwich: residual + norm(x), then the next norm of the sum, bit for bit as the
    separate kernel calls and PyTorch's add; without a next weight only the sum."""
    g = torch.Generator().manual_seed(11)
    x, residual = (torch.randn(5, 640, generator=g) * 4).to(dtype), torch.randn(5, 640, generator=g).to(dtype)
    w1, w2 = torch.randn(640, generator=g), torch.randn(640, generator=g)
    s, normed = kernels.rms_norm_add(x, residual, w1, 1e-6, w2)
    expected = residual + kernels.rms_norm(x, w1, 1e-6)
    assert torch.equal(s, expected) and torch.equal(normed, kernels.rms_norm(expected, w2, 1e-6))
    s_only, empty = kernels.rms_norm_add(x, residual, w1, 1e-6)
    assert torch.equal(s_only, expected) and empty.numel() == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma_norm_add_paths_agree(dtype: torch.dtype) -> None:
    first, second = GemmaRMSNorm(64, 1e-6, dtype), GemmaRMSNorm(64, 1e-6, dtype)
    with torch.no_grad():
        first.weight.copy_(torch.randn(64))
        second.weight.copy_(torch.randn(64))
    x, residual = (torch.randn(7, 64) * 3).to(dtype), torch.randn(7, 64).to(dtype)
    with torch.inference_mode():
        fast_sum, fast_next = first.norm_add(x, residual, second)
        alone, none = first.norm_add(x, residual)
    slow_sum, slow_next = first.norm_add(x, residual, second)  # autograd enabled: PyTorch ops
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    assert none is None and torch.equal(alone, fast_sum)
    assert torch.allclose(fast_sum.float(), slow_sum.float(), atol=tol, rtol=tol)
    assert fast_next is not None and slow_next is not None
    assert torch.allclose(fast_next.float(), slow_next.float(), atol=tol, rtol=tol)


def test_bad_arguments_raise(kernels) -> None:
    with pytest.raises(RuntimeError, match="weight"):
        kernels.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-5)
    with pytest.raises(RuntimeError, match="next_weight must match"):
        kernels.rms_norm_add(torch.randn(2, 8), torch.randn(2, 8), torch.randn(8), 1e-5, torch.randn(7))
    with pytest.raises(RuntimeError, match="x's dtype or float32"):
        kernels.rms_norm(torch.randn(2, 8).bfloat16(), torch.randn(8).half(), 1e-5)
    with pytest.raises(RuntimeError, match="residual"):
        kernels.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-5)
    cos, sin = torch.randn(2, 8), torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernels.rotary_(torch.randn(2, 4, 16)[..., ::2], torch.randn(2, 1, 8), cos, sin)
    with pytest.raises(RuntimeError, match="at most head_dim"):
        kernels.rotary_(torch.randn(2, 4, 4), torch.randn(2, 1, 4), cos, sin)
    with pytest.raises(RuntimeError, match="one dtype"):
        kernels.rotary_(torch.randn(2, 4, 8), torch.randn(2, 1, 8), cos.bfloat16(), sin.bfloat16())
