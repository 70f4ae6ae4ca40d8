"""oneDNN-packed linear weights (tram/model/layers/cpu_packed.py) and their routing in tram/model/layers/linear.py.

The packed path must give F.linear's result within float rounding for any row count (including
the 2-3 rows where routing switches from the skinny kernel), with bias, on Linear and on the LM
head tied or untied; a model loaded for the CPU must come back with its weights packed, and
TRAM_CPU_PACKED_LINEAR=0 must leave them plain.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tram.model.kernels.cpu_kernels import load_cpu_kernels
from tram.model.layers import cpu_packed
from tram.model.layers.cpu_packed import pack_cpu_linears, pack_weight, packed_linear
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.linear import (
    SKINNY_MAX_ROWS,
    SKINNY_MAX_ROWS_BESIDE_PACKED,
    SKINNY_MAX_ROWS_SMALL,
    SMALL_WEIGHT_ELEMENTS,
    Linear,
    linear,
    linear_n,
    skinny_rows_beside_packed,
)

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative to |ref| + 1
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def make(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(m, k, generator=g).to(dtype),
        torch.randn(n, k, generator=g).to(dtype),
        torch.randn(n, generator=g).to(dtype),
    )


def packable(dtype: torch.dtype) -> bool:
    return pack_weight(torch.zeros(4, 4, dtype=dtype)) is not None


def assert_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < TOLERANCES[dtype], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 17, 64, 257])
def test_packed_matches_reference(rows: int, dtype: torch.dtype) -> None:
    if not packable(dtype):
        pytest.skip(f"oneDNN cannot run {dtype} on this CPU (no bf16 instructions): the layer keeps F.linear")
    x, w, b = make(rows, 96, 80, dtype)
    packed = pack_weight(w)
    assert packed is not None and packed.is_mkldnn
    ref = x.double() @ w.double().T + b.double()
    with torch.inference_mode():
        assert_close(packed_linear(x, packed, b), ref, dtype)
        routed = linear(x, w, b, packed)  # the skinny kernel for a row or two, oneDNN past that
    assert routed.shape == (rows, 96) and routed.dtype == dtype
    assert_close(routed, ref, dtype)


@pytest.mark.parametrize("rows", [3, 40])
def test_bf16_without_bf16_gemms_packs_float32(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without bf16 instructions (AVX2): the packed copy is float32, activations are widened and
    the result rounded once to bfloat16 -- a bf16 GEMM's float32 accumulation and single rounding."""
    monkeypatch.setattr(cpu_packed, "bf16_gemm_native", lambda: False)
    x, w, b = make(rows, 96, 80, torch.bfloat16, seed=2)
    packed = pack_weight(w)
    assert packed is not None and packed.dtype == torch.float32
    with torch.inference_mode():
        y = linear(x, w, b, packed)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ w.double().T + b.double()
    assert (
        torch.equal(y, exact.float().to(torch.bfloat16))
        or ((y.double() - exact).abs() / (exact.abs() + 1)).max().item() < TOLERANCES[torch.bfloat16]
    )


def test_routing_by_rows() -> None:
    """Past the skinny limit a packed layer runs oneDNN, which is not the skinny kernel's result bit
    for bit; at or under it the skinny kernel runs (bitwise equal to calling it without packing). A
    small weight (SMALL_WEIGHT_ELEMENTS) keeps the skinny kernel up to its own row limit."""
    x, w, b = make(8, 600, 288, torch.float32, seed=1)
    packed = pack_weight(w)
    limit = SKINNY_MAX_ROWS_BESIDE_PACKED[torch.float32]
    assert w.numel() > SMALL_WEIGHT_ELEMENTS and skinny_rows_beside_packed(torch.float32, w.numel()) == limit
    with torch.inference_mode():
        assert torch.equal(linear(x[:limit], w, b, packed), linear(x[:limit], w, b))
        assert torch.equal(linear(x, w, b, packed), packed_linear(x, packed, b))
    small_x, small_w, small_b = make(17, 172, 64, torch.float32, seed=2)
    small = pack_weight(small_w)
    rows = skinny_rows_beside_packed(torch.float32, small_w.numel())
    assert rows == SKINNY_MAX_ROWS_SMALL[torch.float32] > SKINNY_MAX_ROWS[torch.float32] > limit
    with torch.inference_mode():
        skinny = load_cpu_kernels().skinny_linear(small_x[:rows], small_w, small_b)
        assert torch.equal(linear(small_x[:rows], small_w, small_b, small), skinny)
        assert torch.equal(linear(small_x, small_w, small_b, small), packed_linear(small_x, small, small_b))


def test_autograd_keeps_f_linear() -> None:
    x, w, b = make(5, 12, 8, torch.float32)
    w.requires_grad_(True)
    y = linear(x, w, b, pack_weight(w.detach()))
    y.sum().backward()  # the oneDNN op has no backward: linear() must not have used it
    assert w.grad is not None and torch.equal(y.detach(), F.linear(x, w.detach(), b))


def test_unsupported_weights_are_not_packed() -> None:
    assert pack_weight(torch.zeros(4, 4, dtype=torch.float16)) is None
    assert pack_weight(torch.zeros(4, 4, 4)) is None


def tiny_model(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = VocabEmbedding(50, 16, torch.float32)
    model.model.proj = Linear(16, 24)
    model.model.projs = torch.nn.ModuleList([Linear(16, 8), Linear(16, 8)])
    model.lm_head = LMHead(16, 50, torch.float32, tied=tied)
    if not tied:
        torch.nn.init.normal_(model.lm_head.weight)
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pack_cpu_linears_packs_layers_and_lm_head(tied: bool) -> None:
    model = tiny_model(tied)
    assert pack_cpu_linears(model) == 4
    assert all(
        m.packed_weight is not None and m.packed_weight.is_mkldnn
        for m in (model.model.proj, *model.model.projs, model.lm_head)
    )
    assert "packed_weight" not in "".join(model.state_dict())  # loading and saving never see it
    hidden = torch.randn(6, 16)
    with torch.inference_mode():
        logits = model.lm_head(hidden, model.model.embed_tokens)
        head = model.model.embed_tokens.weight if tied else model.lm_head.weight
        assert_close(logits, hidden.double() @ head.double().T, torch.float32)
        outs = linear_n(hidden, list(model.model.projs))
        for out, layer in zip(outs, model.model.projs):
            assert_close(out, hidden.double() @ layer.weight.double().T + layer.bias.double(), torch.float32)


def test_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_packed.ENV_SWITCH, "0")
    model = tiny_model(tied=False)
    assert pack_cpu_linears(model) == 0
    assert model.model.proj.packed_weight is None and model.lm_head.packed_weight is None


def test_loaded_cpu_model_is_packed(stories_path: str) -> None:
    from tram.config import ModelConfig
    from tram.model.loader import load_model

    model = load_model(ModelConfig(model=stories_path, dtype="float32"))
    from tram.model.layers.attention import Attention
    from tram.model.layers.mlp import GatedMLP

    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    stacked = {id(linear) for owner in mlps + attns for linear in owner.stacked_linears()}
    linears = [m for m in model.modules() if isinstance(m, Linear) and id(m) not in stacked]
    assert mlps and all(mlp.packed_gate_up is not None for mlp in mlps)
    assert attns and all(attn.packed_qkv is not None for attn in attns)
    assert all(linear.packed_weight is None for attn in attns for linear in attn.stacked_linears())
    assert linears and all(m.packed_weight is not None for m in linears)
    assert model.lm_head.packed_weight is not None


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("rows", [1, 2, 3, 40])
def test_gated_mlp_stacks_gate_and_up(rows: int, act: str) -> None:
    """gate and up become one packed [2I, K] weight (no copy of their own); past the skinny rows one
    GEMM runs both and silu_and_mul (or the activation and the product) finishes; same result."""
    from tram.model.layers.activation import get_activation
    from tram.model.layers.mlp import GatedMLP

    torch.manual_seed(3)
    mlp = GatedMLP(32, 48, act, bias=True, dtype=torch.float32)
    for p in mlp.parameters():
        torch.nn.init.normal_(p, std=0.2)
    mlp.eval().requires_grad_(False)
    holder = torch.nn.Module()
    holder.mlp = mlp
    assert pack_cpu_linears(holder) == 2  # gate+up stacked, and down
    assert mlp.packed_gate_up is not None and mlp.gate_proj.packed_weight is None and mlp.up_proj.packed_weight is None
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        y = mlp(x)
    xd = x.double()
    g = xd @ mlp.gate_proj.weight.double().T + mlp.gate_proj.bias.double()
    u = xd @ mlp.up_proj.weight.double().T + mlp.up_proj.bias.double()
    ref = (get_activation(act)(g) * u) @ mlp.down_proj.weight.double().T + mlp.down_proj.bias.double()
    assert_close(y, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_mlp_in_row_chunks_is_bit_exact(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long prefill's MLP runs in row chunks (mlp.chunk_rows); every row comes out bit for bit as
    from one GEMM over all rows, so chunking never changes a request's output."""
    from tram.model.layers import mlp as mlp_module

    torch.manual_seed(4)
    mlp = mlp_module.GatedMLP(64, 96, "silu", bias=False, dtype=dtype)
    for p in mlp.parameters():
        torch.nn.init.normal_(p, std=0.2)
    mlp.eval().requires_grad_(False)
    holder = torch.nn.Module()
    holder.mlp = mlp
    pack_cpu_linears(holder)
    x = torch.randn(1000, 64).to(dtype)
    assert mlp_module.chunk_rows(2 * 96, x.element_size()) >= 1000  # the default: one GEMM here
    with torch.inference_mode():
        whole = mlp(x)
        monkeypatch.setattr(mlp_module, "MLP_CHUNK_BYTES", 64 * 2 * 96 * x.element_size())
        monkeypatch.setattr(mlp_module, "MIN_CHUNK_ROWS", 64)
        assert mlp_module.chunk_rows(2 * 96, x.element_size()) == 64
        chunked = mlp(x)  # 16 chunks, the last of 40 rows
    assert torch.equal(whole, chunked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("rows", [1, 2, 3, 40])
def test_attention_stacks_q_k_v(rows: int, bias: bool, dtype: torch.dtype) -> None:
    """q, k and v become one packed [(H + 2 Hkv) D, hidden] weight (no copy of their own); past the
    skinny rows one GEMM runs the three and they come back as its column slices; same result as the
    three projections."""
    from tram.model.layers.attention import Attention

    if not packable(dtype):
        pytest.skip(f"oneDNN cannot run {dtype} on this CPU (no bf16 instructions)")
    torch.manual_seed(5)
    attn = Attention(32, 4, 2, 8, backend=None, dtype=dtype, qkv_bias=bias, o_bias=False)  # type: ignore[arg-type]
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.2)
    attn.eval().requires_grad_(False)
    holder = torch.nn.Module()
    holder.attn = attn
    assert pack_cpu_linears(holder) == 2  # q+k+v stacked, and o
    assert attn.packed_qkv is not None and all(linear.packed_weight is None for linear in attn.stacked_linears())
    x = torch.randn(rows, 32).to(dtype)
    with torch.inference_mode():
        q, k, v = attn.project_qkv(x)
    assert (q.shape, k.shape, v.shape) == ((rows, 32), (rows, 16), (rows, 16))
    for got, proj in zip((q, k, v), attn.stacked_linears()):
        ref = x.double() @ proj.weight.double().T
        assert_close(got, ref + proj.bias.double() if bias else ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (5, 64), (33, 130)])
def test_silu_and_mul_kernel(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """silu(gate) * up as transformers rounds it (silu in the dtype, then the product), including
    large |gate| where exp would overflow a naive formula."""
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    rows, inter = shape
    g = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 4).to(dtype)
    gate_up[0, 0] = 100.0
    if inter > 1:
        gate_up[0, 1] = -100.0
    out = load_cpu_kernels().silu_and_mul(gate_up)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    ref = F.silu(gate) * up
    assert out.shape == (rows, inter) and out.dtype == dtype and torch.isfinite(out).all()
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert ((out.double() - ref.double()).abs() / (ref.double().abs() + 1)).max().item() < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_and_mul_pair_is_silu_and_mul_of_the_halves(dtype: torch.dtype) -> None:
    """Gate and up as two tensors (a quantized model's two linears), or as column slices of one:
    the same bits as silu_and_mul on them side by side."""
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    gate_up = (torch.randn(37, 2 * 70, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    want = kernels.silu_and_mul(gate_up)
    gate, up = gate_up[:, :70], gate_up[:, 70:]
    assert torch.equal(kernels.silu_and_mul_pair(gate, up), want)
    assert torch.equal(kernels.silu_and_mul_pair(gate.contiguous(), up.contiguous()), want)
    with pytest.raises(RuntimeError, match="gate and up must be"):
        kernels.silu_and_mul_pair(gate, up[:, :69])
