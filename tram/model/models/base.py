"""What every causal LM in Tram looks like to the model runner."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata, get_attention_backend
from tram.model.layers.attention import Attention
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.spec import DecoderSpec


def resolve_backend(attention_backend: AttentionBackend | str) -> AttentionBackend:
    return get_attention_backend(attention_backend) if isinstance(attention_backend, str) else attention_backend


def spec_attention(
    spec: DecoderSpec,
    layer_idx: int,
    backend: AttentionBackend,
    dtype: torch.dtype,
    kind: type[Attention] = Attention,
    **extras: object,
) -> Attention:
    """Layer layer_idx's attention as the spec shapes it; `kind`: a family's Attention subclass that
    takes Attention's arguments; extras: a family's own (scale, head_norm, logits_soft_cap)."""
    return kind(
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        backend=backend,
        dtype=dtype,
        qkv_bias=spec.qkv_bias,
        o_bias=spec.o_bias,
        sliding_window=spec.sliding_windows[layer_idx],
        **extras,  # type: ignore[arg-type]
    )


class DecoderModel(nn.Module):
    """The decoder every family builds: the embedding (on the first pipeline stage), this stage's
    layers, the final norm (on the last). A family sets embed_tokens, layers, norm and rotary_emb,
    and overrides `embed` or `position_args` where it differs; each layer is called as
    layer(h, *position_args, kv_cache, meta)."""

    embed_tokens: nn.Module
    norm: nn.Module
    rotary_emb: nn.Module
    local_layers: tuple[nn.Module, ...]
    pp_first: bool
    pp_last: bool
    # Layers whose input (the residual stream entering them) a forward keeps in `aux_hidden`, side by
    # side [T, len * hidden]: what an EAGLE-3 head drafts from (spec_decode/eagle.py sets them).
    aux_hidden_layers: tuple[int, ...] = ()
    aux_hidden: torch.Tensor | None = None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        return self.embed_tokens(input_ids)

    def position_args(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[object, ...]:
        """What every layer takes about positions: (cos, sin), [T, 1, rotary_dim] each, computed once a step."""
        return self.rotary_emb.cos_sin(positions, dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # input_ids, positions [T] -> [T, hidden]; `hidden` is the previous pipeline stage's output
        h = self.embed(input_ids) if self.pp_first else hidden  # [T, hidden]
        args = self.position_args(positions, h.dtype)
        # A layer with forward_residual leaves its residual add to the next norm's call (add_rms_norm):
        # the stream is then residual + h, one op and its dispatch fewer per layer.
        residual: torch.Tensor | None = None
        aux: list[torch.Tensor] = []
        for i, (layer, kv_cache) in enumerate(zip(self.local_layers, kv_caches, strict=True)):
            if self.aux_hidden_layers and i in self.aux_hidden_layers:  # a layer named twice is kept twice
                aux.extend([h if residual is None else residual + h] * self.aux_hidden_layers.count(i))
            if hasattr(layer, "forward_residual"):
                h, residual = layer.forward_residual(h, residual, *args, kv_cache, meta)
                continue
            if residual is not None:
                h, residual = residual + h, None
            h = layer(h, *args, kv_cache, meta)
        if aux:
            self.aux_hidden = torch.cat(aux, dim=-1)
        if residual is None:
            return self.norm(h) if self.pp_last else h
        if self.pp_last and hasattr(self.norm, "add_forward"):
            return self.norm.add_forward(h, residual)[0]
        h = residual + h
        return self.norm(h) if self.pp_last else h


class CausalLM(nn.Module):
    """A decoder-only LM on a flattened variable-length batch with a paged KV cache.

    forward(input_ids [T], positions [T], kv_caches (one [2, num_blocks, block_size, Hkv, D] tensor per
    layer of this pipeline stage), meta, hidden) -> hidden [T, hidden_size] (normed on the last stage);
    compute_logits(hidden [N, hidden_size]) -> [N, vocab] float32.

    Families build `self.model` (a decoder whose forward has that signature and which owns
    `embed_tokens`) and `self.lm_head`, and are constructed as cls(hf_config, dtype, attention_backend).
    """

    model: nn.Module
    lm_head: LMHead

    # Checkpoint names of the modules another pipeline stage owns (pipeline.cut_to_stage); the loader skips them.
    missing_prefixes: tuple[str, ...] = ()
    # Checkpoint tensors that stack several of the model's linears (weight_utils.fused_parts).
    fused_weights: ClassVar[dict[str, tuple[str, ...]]] = {}

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`hidden`: the previous pipeline stage's output, on every stage but the first."""
        return self.model(input_ids, positions, kv_caches, meta, hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] float32
        embed_tokens: VocabEmbedding = self.model.embed_tokens
        return self.lm_head(hidden, embed_tokens)
