"""Attention sinks (gpt-oss: a learned logit per head that joins the softmax's denominator and adds no
value) through every attention path: the C++ decode and prefill kernels, the PyTorch backend's
kernel and SDPA-free paths (decodes, prefills with and without a cached prefix, sliding windows, an
fp8 cache), the Triton kernel under its interpreter (with and without split-K), and the Attention
layer's parameter and its tensor-parallel slice. Oracle: dense float64 PyTorch attention written as
transformers' eager_attention_forward for gpt-oss (softmax over [scores, sink], the sink dropped),
and that function itself for one request.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import StepRequest, build_meta
from triton_interp import interpreter_on, load_interpreted

from tram.distributed.parallel_state import TensorParallel, get_tp, set_tp
from tram.model.attention import torch_backend
from tram.model.attention.base import AttentionMetadata
from tram.model.attention.kv_quant import dequantize_kv
from tram.model.kernels.cpu_kernels import load_cpu_kernels, paged_decode_attention, paged_prefill_attention_
from tram.model.layers.attention import Attention
from tram.model.weight_utils import get_weight_loader

BLOCK = 16
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
# Mixed step: a prompt without prefix, a decode, a chunk with a cached prefix (crossing blocks), a decode
# far enough in that a window of 7 hides most of its context.
MIXED = [StepRequest([0, 1], 0, 20), StepRequest([3, 4, 5], 30, 1), StepRequest([6, 7], 9, 12)]
MIXED.append(StepRequest([9, 10], 17, 1))


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert load_cpu_kernels() is not None, "the C++ kernels must build here"


def sinks_for(num_heads: int, seed: int = 3) -> torch.Tensor:
    """Sinks around the scores' size, one far above them (its head's output shrinks towards 0)."""
    sinks = torch.randn(num_heads, generator=torch.Generator().manual_seed(seed)) * 2
    sinks[-1] = 40.0
    return sinks


def reference(
    query: torch.Tensor,  # [T, H, D]
    kv: torch.Tensor,  # [2, N, bs, Hkv, D], already holding the step's K/V; any float dtype
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:  # [T, H, D] float64
    """Dense float64 attention per request over its context gathered through its block table."""
    _, _, bs, hkv, d = kv.shape
    group = query.shape[1] // hkv
    out = torch.zeros(query.shape, dtype=torch.float64)
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
        ids = meta.block_tables[i, : -(-seq_len // bs)].long()
        k, v = (kv[j][ids].reshape(-1, hkv, d)[:seq_len].double().repeat_interleave(group, 1) for j in (0, 1))
        scores = torch.einsum("qhd,khd->hqk", query[start : start + q_len].double(), k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len).view(-1, 1)
        k_pos = torch.arange(seq_len).view(1, -1)
        seen = k_pos <= q_pos
        if window is not None:
            seen &= k_pos > q_pos - window
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks.double().view(-1, 1, 1).expand(-1, q_len, 1)
            probs = torch.cat((scores, sink), -1).softmax(-1)[..., :-1]
        out[start : start + q_len] = torch.einsum("hqk,khd->qhd", probs, v)
        start += q_len
    return out


def step(dtype: torch.dtype, seed: int, reqs: list[StepRequest] = MIXED, kv_dtype: torch.dtype | None = None):
    meta = build_meta(reqs, BLOCK)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(meta.num_tokens, n, HEAD_DIM, generator=gen).to(dtype) for n in (HEADS, KV_HEADS, KV_HEADS))
    cache = torch.randn(2, 12, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(kv_dtype or dtype)
    return meta, q, k, v, cache


def backend_run(meta, q, k, v, cache, window, sinks, **kw) -> torch.Tensor:
    meta.plan = None  # a fresh plan per run, as each step gets
    with torch.inference_mode():  # as the model runner calls it: the C++ kernels never run under autograd
        return torch_backend.TorchAttentionBackend().forward(q, k, v, cache, meta, 0.4, window, sinks=sinks, **kw)


# ------------------------------------------------------------------------------- the C++ kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_decode_kernel(dtype, window) -> None:
    reqs = [StepRequest([0, 1, 2], 37, 1), StepRequest([3], 4, 1), StepRequest([4, 5], 16, 1)]
    meta, q, _, _, cache = step(dtype, 1, reqs)
    sinks = sinks_for(HEADS)
    got = paged_decode_attention(q, cache, meta.block_tables, meta.seq_lens, 0.4, window, sinks=sinks)
    torch.testing.assert_close(got.double(), reference(q, cache, meta, 0.4, window, sinks), **TOL[dtype])
    assert got[:, -1].abs().max() < 1e-6  # the head whose sink outweighs every score


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 7])
def test_prefill_kernel(dtype, window) -> None:
    reqs = [StepRequest([0, 1, 2], 0, 40), StepRequest([3, 4, 5], 21, 19)]  # a prompt, a chunk after a prefix
    meta, q, _, _, cache = step(dtype, 2, reqs)
    sinks = sinks_for(HEADS)
    out = torch.zeros_like(q)
    tables = meta.block_tables
    paged_prefill_attention_(out, q, cache, tables, [0, 40], [40, 19], [40, 40], 0.4, window, sinks=sinks)
    torch.testing.assert_close(out.double(), reference(q, cache, meta, 0.4, window, sinks), **TOL[dtype])


def test_a_sink_of_minus_infinity_is_the_kernel_without_sinks() -> None:
    """The sink joins only the denominator: exp(-inf) adds exactly nothing, bit for bit."""
    meta, q, _, _, cache = step(torch.float32, 4, [StepRequest([0, 1, 2], 0, 33)])
    none = torch.full((HEADS,), float("-inf"))
    decode_q = q[:2]
    tables, lens = meta.block_tables.expand(2, -1), torch.tensor([33, 20])
    plain = paged_decode_attention(decode_q, cache, tables, lens, 0.4)
    assert torch.equal(paged_decode_attention(decode_q, cache, tables, lens, 0.4, sinks=none), plain)
    a, b = torch.zeros_like(q), torch.zeros_like(q)
    paged_prefill_attention_(a, q, cache, meta.block_tables, [0], [33], [33], 0.4)
    paged_prefill_attention_(b, q, cache, meta.block_tables, [0], [33], [33], 0.4, sinks=none)
    assert torch.equal(a, b)


def test_kernels_reject_bad_sinks() -> None:
    meta, q, _, _, cache = step(torch.float32, 5, [StepRequest([0], 0, 3)])
    module = load_cpu_kernels()
    for bad in (torch.zeros(HEADS + 1), torch.zeros(HEADS, dtype=torch.float64), torch.zeros(2 * HEADS)[::2]):
        with pytest.raises(RuntimeError, match="sinks"):
            module.paged_decode_attention(q[:1], cache, meta.block_tables, meta.seq_lens, 0.4, sinks=bad)
        with pytest.raises(RuntimeError, match="sinks"):
            module.paged_prefill_attention_(
                torch.zeros_like(q), q, cache, meta.block_tables, [0], [3], [3], 0.4, sinks=bad
            )


# ------------------------------------------------------------------------------ the torch backend


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 7])
def test_backend_kernel_and_torch_paths(monkeypatch: pytest.MonkeyPatch, dtype, window) -> None:
    """A mixed step through the backend: the C++ kernels, then the PyTorch paths (SDPA has no sinks:
    the explicit scores path), each against the reference; sinks change the result."""
    meta, q, k, v, cache = step(dtype, 6)
    sinks = sinks_for(HEADS)
    kernel_cache = cache.clone()
    kernels = backend_run(meta, q, k, v, kernel_cache, window, sinks)
    want = reference(q, kernel_cache, meta, 0.4, window, sinks)
    torch.testing.assert_close(kernels.double(), want, **TOL[dtype])
    without = backend_run(meta, q, k, v, cache.clone(), window, None)
    assert not torch.allclose(kernels.float(), without.float(), atol=1e-2)
    monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
    monkeypatch.setattr(torch_backend, "load_cpu_kernels", lambda: None)
    torch_paths = backend_run(meta, q, k, v, cache.clone(), window, sinks)
    torch.testing.assert_close(torch_paths.double(), want, **TOL[dtype])


def test_backend_prompt_without_prefix_matches_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """One prompt through both backend paths against gpt-oss's own eager_attention_forward."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    meta, q, k, v, cache = step(torch.float32, 7, [StepRequest([0, 1], 0, 29)])
    sinks = sinks_for(HEADS)
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, HEADS // KV_HEADS, False
    mask = torch.full((29, 29), float("-inf")).triu(1).view(1, 1, 29, 29)
    want, _ = eager_attention_forward(
        module, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, 0.4
    )
    torch.testing.assert_close(backend_run(meta, q, k, v, cache.clone(), None, sinks), want[0], **TOL[torch.float32])
    monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
    torch.testing.assert_close(backend_run(meta, q, k, v, cache.clone(), None, sinks), want[0], **TOL[torch.float32])


@pytest.mark.parametrize("window", [None, 7])
def test_backend_fp8_cache(monkeypatch: pytest.MonkeyPatch, window) -> None:
    """An fp8 cache: both paths attend over the rounded keys and values, with the sinks."""
    meta, q, k, v, cache = step(torch.float32, 8, kv_dtype=torch.float8_e4m3fn)
    sinks = sinks_for(HEADS)
    kernel_cache = cache.clone()
    kernels = backend_run(meta, q, k, v, kernel_cache, window, sinks, k_scale=0.5, v_scale=0.25)
    widened = torch.stack([dequantize_kv(kernel_cache[i], torch.float32, s) for i, s in ((0, 0.5), (1, 0.25))])
    want = reference(q, widened, meta, 0.4, window, sinks)
    torch.testing.assert_close(kernels.double(), want, atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
    monkeypatch.setattr(torch_backend, "load_cpu_kernels", lambda: None)
    torch_paths = backend_run(meta, q, k, v, cache.clone(), window, sinks, k_scale=0.5, v_scale=0.25)
    torch.testing.assert_close(torch_paths.double(), want, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------- the Triton kernel


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 6])
def test_triton_kernel(monkeypatch: pytest.MonkeyPatch, num_splits, window) -> None:
    pytest.importorskip("triton")
    tk = load_interpreted("_tram_triton_kernels_interpreted", "tram/model/attention/triton_kernels.py")
    interpreter_on(monkeypatch)
    reqs = [StepRequest([0, 1, 2], 37, 1), StepRequest([3], 4, 1)]
    if num_splits == 1:  # split-K is for decode-only steps
        reqs += [StepRequest([4, 5], 9, 12), StepRequest([6, 7], 0, 18)]
    meta, q, k, v, cache = step(torch.float32, 9, reqs)
    sinks = sinks_for(HEADS)
    tk.write_kv_cache(k, v, cache, meta.slot_mapping)
    out = torch.zeros_like(q)
    tk.paged_attention(
        q,
        cache,
        out,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        0.4,
        num_reqs=len(reqs),
        max_query_len=meta.max_query_len,
        sliding_window=window,
        num_splits=num_splits,
        sinks=sinks,
    )
    torch.testing.assert_close(out.double(), reference(q, cache, meta, 0.4, window, sinks), **TOL[torch.float32])


# ------------------------------------------------------------------------------- the layer


@torch.no_grad()  # as the loader fills parameters
def test_attention_layer_sinks_parameter_and_tensor_parallel_slice() -> None:
    full = torch.arange(8, dtype=torch.bfloat16)  # a checkpoint's sinks, in its dtype
    layer = Attention(
        64,
        8,
        2,
        HEAD_DIM,
        torch_backend.TorchAttentionBackend(),
        torch.bfloat16,
        qkv_bias=False,
        o_bias=False,
        sinks=True,
    )
    assert layer.sinks.dtype == torch.float32 and layer.sinks.shape == (8,)
    assert "sinks" in dict(layer.named_parameters())
    get_weight_loader(layer.sinks)(layer.sinks, full)
    assert torch.equal(layer.sinks.data, full.float())
    plain = Attention(
        64, 8, 2, HEAD_DIM, torch_backend.TorchAttentionBackend(), torch.float32, qkv_bias=False, o_bias=False
    )
    assert plain.sinks is None and "sinks" not in dict(plain.named_parameters())
    previous = get_tp()
    set_tp(TensorParallel(rank=1, size=2))
    try:
        ranked = Attention(
            64,
            8,
            2,
            HEAD_DIM,
            torch_backend.TorchAttentionBackend(),
            torch.float32,
            qkv_bias=False,
            o_bias=False,
            sinks=True,
        )
    finally:
        set_tp(previous)
    get_weight_loader(ranked.sinks)(ranked.sinks, full)
    assert torch.equal(ranked.sinks.data, full[4:].float())  # rank 1's query heads 4..7


@pytest.mark.parametrize("layer_idx", [0, 1])  # gpt-oss's sliding (window 4 here) and full layers
@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_gpt_oss_attention_layer_matches_transformers(monkeypatch: pytest.MonkeyPatch, layer_idx, cpu_kernels) -> None:
    """Tram's Attention with sinks, YaRN RoPE and gpt-oss's window, fed a sequence as two prefill chunks
    and three decodes through a paged cache, against transformers' GptOssAttention over the whole."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    from tram.model.layers.rope import RotaryEmbedding

    config = GptOssConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4, num_hidden_layers=2
    )
    config._attn_implementation = "eager"
    config.rope_parameters["original_max_position_embeddings"] = 16  # the YaRN ramp inside the tiny head
    torch.manual_seed(0)
    hf = GptOssAttention(config, layer_idx).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_(torch.randn(param.shape) * (2.0 if name == "sinks" else 0.3))
    length = 15
    x = torch.randn(length, 64)
    positions = torch.arange(length)
    window = config.sliding_window if layer_idx == 0 else None
    seen = positions.view(1, -1) <= positions.view(-1, 1)
    if window is not None:
        seen &= positions.view(1, -1) > positions.view(-1, 1) - window
    mask = torch.zeros(length, length).masked_fill(~seen, float("-inf")).view(1, 1, length, length)
    with torch.no_grad():
        want = hf(x[None], GptOssRotaryEmbedding(config)(x, positions[None]), mask)[0][0]

    layer = Attention(
        64,
        4,
        2,
        16,
        torch_backend.TorchAttentionBackend(),
        torch.float32,
        qkv_bias=True,
        o_bias=True,
        sliding_window=window,
        sinks=True,
    )
    layer.load_state_dict(hf.state_dict())
    rope = RotaryEmbedding(config, 16, max_positions=64)
    if not cpu_kernels:
        monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
        monkeypatch.setattr(torch_backend, "load_cpu_kernels", lambda: None)
    cache = torch.zeros(2, 6, 4, 2, 16)
    table = [3, 0, 5, 1]  # blocks of 4 tokens, out of order
    got = []
    for start, count in ((0, 7), (7, 5), (12, 1), (13, 1), (14, 1)):
        meta = build_meta([StepRequest(table, start, count)], 4)
        cos, sin = rope.cos_sin(positions[start : start + count], torch.float32)
        with torch.inference_mode():
            got.append(layer(x[start : start + count], cos, sin, cache, meta))
    torch.testing.assert_close(torch.cat(got), want, atol=2e-5, rtol=1e-5)
