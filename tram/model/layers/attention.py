"""Self-attention over a flattened, paged batch: q/k/v projections, optional per-head q/k norms,
RoPE, the attention backend (which writes the paged KV cache), o_proj."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tram.distributed import get_tp, shard_range
from tram.distributed.parallel_state import kv_head_range
from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.cpu_packed import DecodePairs, PackFn, packed_linear
from tram.model.layers.linear import Linear, linear_n, pack_stacked, takes_packed
from tram.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear, slice_loader
from tram.model.layers.rope import apply_rotary_qk
from tram.model.weight_utils import set_weight_loader

# Builds the norm applied to each head of q and of k over head_dim (Qwen3, Gemma 3), given head_dim.
HeadNormFactory = Callable[[int], nn.Module]


class Attention(nn.Module):
    """Multi-head attention with grouped K/V heads; names equal Hugging Face's (q_proj ... o_proj,
    q_norm, k_norm), so checkpoints load by name.

    scale defaults to head_dim ** -0.5; sliding_window None means full attention, else the query
    sees itself and the sliding_window - 1 keys before it (transformers' convention).
    logits_soft_cap c (Gemma 2) turns each score into c * tanh(score / c) before the mask and softmax.
    input_size: q's, k's and v's input width where it is not hidden_size (an EAGLE-3 head's 2 x hidden).
    sinks=True (gpt-oss) adds `sinks`, a learned logit per head that joins the softmax's denominator
    (checkpoint name self_attn.sinks), kept in float32 whatever the model's dtype.

    Under tensor parallelism each rank holds num_heads / tp query heads and the KV heads they attend
    with (column-parallel q/k/v, replicated KV heads when tp > num_kv_heads), their sinks, and a
    row-parallel o_proj.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        backend: AttentionBackend,
        dtype: torch.dtype,
        *,
        qkv_bias: bool,
        o_bias: bool,
        scale: float | None = None,
        sliding_window: int | None = None,
        head_norm: HeadNormFactory | None = None,
        logits_soft_cap: float | None = None,
        sinks: bool = False,
        input_size: int | None = None,
    ) -> None:
        super().__init__()
        tp = get_tp()
        q_start, self.num_heads = shard_range(num_heads, tp.rank, tp.size)
        kv_start, self.num_kv_heads = kv_head_range(num_heads, num_kv_heads, tp.rank, tp.size)
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        # The KV cache group whose block table this layer reads (the model runner binds it when it
        # lays out the cache; one group unless the cache is hybrid).
        self.kv_group = 0
        self.backend = backend
        # fp8 KV cache scales (stored = k / k_scale): 1.0 as vLLM without calibration; a checkpoint's
        # calibrated k_scale / v_scale would be set here, per layer, at load.
        self.k_scale = 1.0
        self.v_scale = 1.0
        d = head_dim

        def column(first_head: int, heads: int, total_heads: int) -> ColumnParallelLinear:
            return ColumnParallelLinear(
                input_size or hidden_size, total_heads * d, first_head * d, heads * d, bias=qkv_bias, dtype=dtype
            )

        self.q_proj = column(q_start, self.num_heads, num_heads)
        self.k_proj = column(kv_start, self.num_kv_heads, num_kv_heads)
        self.v_proj = column(kv_start, self.num_kv_heads, num_kv_heads)
        self.o_proj = RowParallelLinear(
            num_heads * d, hidden_size, q_start * d, self.num_heads * d, bias=o_bias, dtype=dtype
        )
        if head_norm is not None:
            self.q_norm = head_norm(head_dim)
            self.k_norm = head_norm(head_dim)
        self.has_head_norm = head_norm is not None
        # On CPU, q's, k's and v's weights stacked [(H + 2 Hkv) D, hidden] and packed for oneDNN
        # (pack_stacked): one GEMM for the three past the skinny kernel's rows, which at a decode batch
        # costs less than three narrower ones (docs/benchmarks.md, "q, k and v as one packed weight").
        self.packed_qkv: torch.Tensor | DecodePairs | None = None
        self.packed_qkv_bias: torch.Tensor | None = None
        self.sinks: nn.Parameter | None = None
        if sinks:
            self.sinks = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32))
            set_weight_loader(self.sinks, slice_loader(0, q_start, self.num_heads, num_heads))

    def stacked_linears(self) -> tuple[Linear, Linear, Linear]:
        return self.q_proj, self.k_proj, self.v_proj

    def pack_stacked(self, pack: PackFn) -> torch.Tensor | DecodePairs | None:
        """Packs q, k and v as one weight; returns the packed tensor (None where it cannot be)."""
        self.packed_qkv, self.packed_qkv_bias = pack_stacked(self.stacked_linears(), pack)
        return self.packed_qkv

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [T, H * D], k and v [T, Hkv * D]; from the stacked GEMM they are column slices of its
        output (rows qkv_size apart), which the norms, RoPE and the backends read as they are."""
        stacked_numel = sum(la.weight.numel() for la in self.stacked_linears())
        if self.packed_qkv is not None and takes_packed(x, self.q_proj.weight, stacked_numel):
            q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return packed_linear(x, self.packed_qkv, self.packed_qkv_bias).split([q_size, kv_size, kv_size], dim=-1)
        return tuple(linear_n(x, self.stacked_linears()))

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H * D], k [T, Hkv * D] after the projections, before RoPE; a family whose norm spans
        whole rows (OLMo 2) overrides this."""
        if self.has_head_norm:  # per head; on rows of head_dim (one kernel call on CPU)
            q = self.q_norm(q.reshape(-1, self.head_dim))  # [T * H, D]
            k = self.k_norm(k.reshape(-1, self.head_dim))  # [T * Hkv, D]
        return q, k

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # x [T, hidden] -> [T, hidden]; cos/sin None: a layer without RoPE (SmolLM3's NoPE)
        num_tokens = x.shape[0]
        q, k, v = self.project_qkv(x)
        q, k = self.norm_qk(q, k)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        if cos is not None:
            q, k = apply_rotary_qk(q, k, cos, sin)  # in place on CPU: q and k are fresh tensors
        out = self.backend.forward(
            q,
            k,
            v,
            kv_cache,
            meta.for_group(self.kv_group),
            self.scale,
            self.sliding_window,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            logits_soft_cap=self.logits_soft_cap,
            sinks=self.sinks,
        )  # [T, H, D]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))  # [T, hidden]
