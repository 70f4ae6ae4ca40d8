"""Llama's and Gemma's decode layers on CPU with their dispatch decided once.

The module path decides at every call of every layer what the C++ kernels take (rows, dtypes, packed
or GGUF weights, the attention backend's plan): some 60 Python calls and 40 module attribute lookups a
layer, where a decode row's kernels on a small model take less time than that. A layer program
(`CpuDecodeLayer`, `GemmaDecodeLayer`) makes those decisions at the layer's first forward and keeps the
kernels and tensors they chose; a decode step then costs about one Python call per kernel
(docs/benchmarks.md, "A decode layer's host time").

The same kernels with the same arguments as the module path, so the same bits (tests/model/
test_cpu_decode.py). Each part falls back to its module where the module would take another kernel:
rows past a linear's row kernels (oneDNN's packed GEMM, the tiled GEMMs; the row kernels are the
skinny kernel, GGUF's, and bf16 pairs copies beside oneDNN's), quantized weights other than
GGUF's, a row-parallel linear's all-reduce, an MLP other than the dense gated one (a mixture of
experts). A step with prefills or padding, another device or dtype, autograd, or an attention backend
without `decode_only` runs the modules for the whole layer.

A program holds the layer's Parameter objects and GGUF blocks as they are at the layer's first forward
(after loading, quantizing and packing): loads in place show through; a weight rebound afterwards is
not seen, so whatever rebinds one sets the layer's `cpu_decode` back to None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
from torch import nn

import tram.envs as envs
from tram.model.kernels.cpu_kernels import load_cpu_kernels
from tram.model.layers.attention import Attention
from tram.model.layers.cpu_packed import PAIR_ROWS, DecodePairs, PairPacked
from tram.model.layers.linear import SKINNY_MAX_ROWS, Linear, skinny_rows_beside_packed
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import GemmaRMSNorm, RMSNorm
from tram.model.layers.parallel_linear import RowParallelLinear
from tram.model.quant.weights import SKINNY_MAX_ROWS as GGUF_FLOAT_MAX_ROWS

Outputs = Callable[[torch.Tensor], Sequence[torch.Tensor]]
NO_LIMIT = 1 << 62  # int8 GGUF kernels: every row count


class LinearGroup:
    """Linears that read one x (q/k/v, gate/up, or one alone): up to `limit` rows their row kernel in one
    call (`run`); past that the module path takes another kernel, and so does `fallback`."""

    def __init__(self, limit: int, run: Outputs | None, fallback: Outputs | None = None) -> None:
        self.limit = limit if run is not None else -1
        self.run = run
        self.fallback = fallback

    def __call__(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        return self.run(x) if x.shape[0] <= self.limit else self.fallback(x)


def _gguf_group(kernels: ModuleType, layers: Sequence[Linear]) -> LinearGroup | None:
    from tram.model.gguf.weight import GGUFWeight  # the GGUF package is optional to this layer

    quants = [layer.quant for layer in layers]
    if not all(isinstance(q, GGUFWeight) and q.data.is_cpu for q in quants):
        return None
    int8 = quants[0].int8_activations
    if any(q.int8_activations != int8 for q in quants):
        return None
    limit = NO_LIMIT if int8 else GGUF_FLOAT_MAX_ROWS
    data, types, biases = [q.data for q in quants], [q.ggml_type for q in quants], [la.bias for la in layers]
    # Looked up at each call, as the module path does (benchmarks/cpu_step_gaps.py wraps the kernels).
    if len(layers) > 1:
        many = "gguf_linear_int8_n" if int8 else "gguf_linear_n"
        return LinearGroup(limit, lambda x: getattr(kernels, many)(x, data, types, biases))
    one = "gguf_linear_int8" if int8 else "gguf_linear"
    return LinearGroup(limit, lambda x: (getattr(kernels, one)(x, data[0], types[0], biases[0]),))


def _dense_group(
    kernels: ModuleType, layers: Sequence[Linear], dtype: torch.dtype, stacked: Stacked
) -> LinearGroup | None:
    """The skinny kernel's rows as `linear` / `linear_n` choose them, then a pairs copy's beside
    oneDNN's (the layer's own, or the stacked weight's for q/k/v and gate/up) up to PAIR_ROWS."""
    if dtype not in SKINNY_MAX_ROWS or any(la.quant is not None or la.weight.dtype != dtype for la in layers):
        return None
    packed = [la.packed_weight is not None for la in layers]
    if len(layers) == 1 and isinstance(layers[0].packed_weight, PairPacked):
        return None  # pair_linear at every row count
    beside = stacked is not None or (all(packed) if len(layers) > 1 else packed[0])
    numel = sum(la.weight.numel() for la in layers)
    limit = skinny_rows_beside_packed(dtype, numel) if beside else SKINNY_MAX_ROWS[dtype]
    weights, biases = [la.weight for la in layers], [la.bias for la in layers]
    if len(layers) > 1:
        group = LinearGroup(limit, lambda x: kernels.skinny_linear_n(x, weights, biases))
    else:
        group = LinearGroup(limit, lambda x: (kernels.skinny_linear(x, weights[0], biases[0]),))
    pairs = _pairs_outputs(kernels, layers, stacked)
    if pairs is not None:
        skinny, skinny_limit = group.run, group.limit
        group = LinearGroup(PAIR_ROWS, lambda x: skinny(x) if x.shape[0] <= skinny_limit else pairs(x))
    return group


# A group's stacked weight where its linears are packed as one (q/k/v, gate/up): (packed, bias).
Stacked = tuple["torch.Tensor | DecodePairs", "torch.Tensor | None"] | None


def _pairs_outputs(kernels: ModuleType, layers: Sequence[Linear], stacked: Stacked) -> Outputs | None:
    """The group's outputs from a pairs copy beside oneDNN's (column slices of the stacked output, as
    the module path's), or None where it has none."""
    if stacked is not None:
        both, bias = stacked
        sizes = [la.out_features for la in layers]
    elif len(layers) == 1:
        both, bias, sizes = layers[0].packed_weight, layers[0].bias, None
    else:
        return None
    run = _pairs_linear(kernels, both, bias)
    if run is None:
        return None
    if sizes is None:
        return lambda x: (run(x),)
    return lambda x: run(x).split(sizes, dim=-1)


def _pairs_linear(
    kernels: ModuleType, packed: torch.Tensor | DecodePairs | None, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """x @ W.T + bias on a DecodePairs' pairs copy (None for any other packing)."""
    if not isinstance(packed, DecodePairs):
        return None
    data, width = packed.pairs.data, packed.pairs.out_features
    return lambda x: kernels.pair_linear(x, data, width, bias)


def linear_group(
    kernels: ModuleType,
    layers: Sequence[Linear],
    dtype: torch.dtype,
    stacked: Stacked = None,
    fallback: Outputs | None = None,
) -> LinearGroup:
    """The group's row kernels where the module path has them for it (none for a row-parallel linear's
    all-reduce, other quantized weights, a weight packed in pairs of k alone), and `fallback` past them.
    `stacked`: the group's weights also packed as one (q/k/v, gate/up), which takes the rows past them."""
    group = None
    if not any(isinstance(la, RowParallelLinear) and la.tp_size != 1 for la in layers):
        group = _gguf_group(kernels, layers) or _dense_group(kernels, layers, dtype, stacked)
    if group is None:
        return LinearGroup(0, None, fallback)
    if stacked is not None and not isinstance(stacked[0], DecodePairs):  # the stacked GEMM takes the rest
        group.limit = min(group.limit, skinny_rows_beside_packed(dtype, sum(la.weight.numel() for la in layers)))
    group.fallback = fallback
    return group


class DecodeAttention:
    """An Attention module's decode step: q/k/v, the head norms, RoPE, the backend's decode-only path, o."""

    def __init__(self, attn: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> None:
        self.attn, self.kernels = attn, kernels
        self.backend, self.kv_group = attn.backend, attn.kv_group
        self.heads = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        self.args = (
            float(attn.scale),
            int(attn.sliding_window or 0),
            float(attn.k_scale),
            float(attn.v_scale),
            float(attn.logits_soft_cap or 0.0),
        )
        stacked = None if attn.packed_qkv is None else (attn.packed_qkv, attn.packed_qkv_bias)
        self.qkv = linear_group(kernels, attn.stacked_linears(), dtype, stacked, attn.project_qkv)
        self.o = linear_group(kernels, (attn.o_proj,), dtype, fallback=lambda x: (attn.o_proj(x),))
        # Per-head norms Attention.norm_qk runs as one kernel call each (Qwen3's, Gemma's): called here.
        norms = (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
        plain = attn.has_head_norm and type(attn).norm_qk is Attention.norm_qk
        self.head_norms = norms if plain and all(type(n) in (RMSNorm, GemmaRMSNorm) for n in norms) else None

    def plan(self, meta: Any, kv_cache: torch.Tensor, rows: int) -> tuple[Any, Any] | None:
        """(this layer's metadata, the backend's plan) where the step is decodes only, else None."""
        meta = meta.for_group(self.kv_group)
        plan = self.backend.decode_only_plan(meta, kv_cache, rows)
        return None if plan is None else (meta, plan)

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        kv_cache: torch.Tensor,
        planned: tuple[Any, Any],
    ) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        rows = x.shape[0]
        q, k, v = self.qkv(x)
        attn = self.attn
        heads, kv_heads, head_dim = self.heads
        if self.head_norms is not None:
            q, k = self._head_norm(0, q, head_dim), self._head_norm(1, k, head_dim)
        elif attn.has_head_norm:
            q, k = attn.norm_qk(q, k)
        q, k, v = q.view(rows, heads, head_dim), k.view(rows, kv_heads, head_dim), v.view(rows, kv_heads, head_dim)
        if cos is not None:
            self.kernels.rotary_(q, k, cos.squeeze(1), sin.squeeze(1))  # fresh q and k: rotated in place
        out = self.backend.decode_only(q, k, v, kv_cache, *planned, self.args, attn.sinks)
        (o,) = self.o(out.view(rows, heads * head_dim))
        return o

    def _head_norm(self, which: int, x: torch.Tensor, head_dim: int) -> torch.Tensor:  # -> [T * heads, D]
        norm = self.head_norms[which]
        weight = norm.scale(norm.weight) if type(norm) is GemmaRMSNorm else norm.weight
        return self.kernels.rms_norm(x.reshape(-1, head_dim), weight, norm.eps)


class DecodeMLP:
    """A dense gated MLP's decode step (gate/up, the activation, down); any other MLP through its module."""

    def __init__(self, mlp: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> None:
        self.mlp, self.kernels = mlp, kernels
        self.limit = -1  # most rows on the row kernels; the module past them
        if type(mlp) is GatedMLP:
            # No fallback per group: past either's rows the whole MLP runs its module (a packed gate/up
            # goes through silu_and_mul on the stacked output there).
            stacked = None if mlp.packed_gate_up is None else (mlp.packed_gate_up, mlp.gate_up_bias)
            self.gate_up = linear_group(kernels, mlp.stacked_linears(), dtype, stacked)
            self.down = linear_group(kernels, (mlp.down_proj,), dtype)
            self.limit = min(self.gate_up.limit, self.down.limit)
            # Past the skinny kernel's rows a pairs copy gives gate and up as one [T, 2I] output, which
            # silu_and_mul reads as the module path's packed forward does.
            self.stacked = _pairs_linear(kernels, mlp.packed_gate_up, mlp.gate_up_bias)
            numel = sum(la.weight.numel() for la in mlp.stacked_linears())
            self.skinny_rows = skinny_rows_beside_packed(dtype, numel) if self.stacked is not None else self.limit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            return self.mlp(x)
        if x.shape[0] > self.skinny_rows:
            gate_up = self.stacked(x)
            if self.mlp.fused_silu:
                (down,) = self.down.run(self.kernels.silu_and_mul(gate_up))
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                (down,) = self.down.run(self.mlp.act(gate) * up)
            return down
        gate, up = self.gate_up.run(x)
        if self.mlp.fused_silu:
            (down,) = self.down.run(self.kernels.silu_and_mul_pair(gate, up))
        else:
            (down,) = self.down.run(self.mlp.act(gate) * up)
        return down


class LayerProgram:
    """A decoder layer's attention and MLP programs, and the test every step passes before one runs."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> None:
        self.dtype, self.kernels = dtype, kernels
        self.attn = DecodeAttention(layer.self_attn, dtype, kernels)
        self.mlp = DecodeMLP(layer.mlp, dtype, kernels)

    def planned(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: Any) -> tuple[Any, Any] | None:
        """The attention's plan where this step is one the program covers, else None."""
        if x.dtype != self.dtype or torch.is_grad_enabled():
            return None
        return self.attn.plan(meta, kv_cache, x.shape[0])


class CpuDecodeLayer(LayerProgram):
    """One LlamaDecoderLayer's decode step: `__call__` returns what its forward_residual would, or None
    where the step is not one it covers (checked before anything runs)."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> None:
        super().__init__(layer, dtype, kernels)
        self.norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        self.eps = (layer.input_layernorm.eps, layer.post_attention_layernorm.eps)
        self.use_rope = layer.use_rope

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        kv_cache: torch.Tensor,
        meta: Any,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        planned = self.planned(x, kv_cache, meta)
        if planned is None:
            return None
        kernels = self.kernels
        if residual is None:
            normed, residual = kernels.rms_norm(x, self.norms[0], self.eps[0]), x
        else:
            normed, residual = kernels.add_rms_norm(x, residual, self.norms[0], self.eps[0])
        if not self.use_rope:
            cos = sin = None
        o = self.attn(normed, cos, sin, kv_cache, planned)
        normed, residual = kernels.add_rms_norm(o, residual, self.norms[1], self.eps[1])
        return self.mlp(normed), residual


class GemmaDecodeLayer(LayerProgram):
    """One Gemma3DecoderLayer's decode step (its four norms around attention and the MLP, each scaling by
    1 + w in float32): `__call__` returns what its forward would, or None where the step is not covered."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> None:
        super().__init__(layer, dtype, kernels)
        self.layer_type = layer.layer_type
        self.norms = (
            layer.input_layernorm,
            layer.post_attention_layernorm,
            layer.pre_feedforward_layernorm,
            layer.post_feedforward_layernorm,
        )

    def __call__(
        self, h: torch.Tensor, ropes: dict[str, tuple[torch.Tensor, torch.Tensor]], kv_cache: torch.Tensor, meta: Any
    ) -> torch.Tensor | None:
        planned = self.planned(h, kv_cache, meta)
        if planned is None:
            return None
        kernels = self.kernels
        first, post_attn, _, post_mlp = self.norms
        cos, sin = ropes[self.layer_type]
        scales = [norm.scale(norm.weight) for norm in self.norms]  # made again only after a load
        o = self.attn(kernels.rms_norm(h, scales[0], first.eps), cos, sin, kv_cache, planned)
        h, x = kernels.rms_norm_add(o, h, scales[1], post_attn.eps, scales[2])
        h, _ = kernels.rms_norm_add(self.mlp(x), h, scales[3], post_mlp.eps, None)
        return h


def _usable(x: torch.Tensor, layer: nn.Module) -> ModuleType | None:
    """The kernels where a decode program can run for layer's x (CPU, float32 or bfloat16, a backend
    with a decode-only path), else None."""
    kernels = load_cpu_kernels()
    if kernels is None or not x.is_cpu or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not envs.TRAM_CPU_DECODE_PROGRAM:
        return None
    return kernels if hasattr(layer.self_attn.backend, "decode_only") else None


def cpu_decode_layer(layer: nn.Module, x: torch.Tensor) -> CpuDecodeLayer | None:
    """A program for `layer` (a LlamaDecoderLayer) where its decode steps can run one, else None."""
    kernels = _usable(x, layer)
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if kernels is None or any(type(n) is not RMSNorm or n.weight.dtype != x.dtype for n in norms):
        return None
    return CpuDecodeLayer(layer, x.dtype, kernels)


def gemma_decode_layer(layer: nn.Module, h: torch.Tensor) -> GemmaDecodeLayer | None:
    """A program for `layer` (a Gemma3DecoderLayer) where its decode steps can run one, else None."""
    kernels = _usable(h, layer)
    norms = (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm)
    norms += (layer.post_feedforward_layernorm,)
    if kernels is None or any(type(n) is not GemmaRMSNorm for n in norms) or norms[1].eps != norms[2].eps:
        return None
    return GemmaDecodeLayer(layer, h.dtype, kernels)
