"""EAGLE heads for speculative decoding (Li et al., 2024 and 2025), in their published checkpoint layouts.

A head drafts from the target's features: at position p it takes the embedding of token p+1 and a
feature of position p, and returns a feature of position p+1, from which it predicts token p+2.
The first pass of a step reads the target's features; each further draft reads the head's own.

- EAGLE (`EagleLlamaForCausalLM`, vLLM's name): fc([embedding, feature]) -> Llama decoder layers, the
  first without its input norm; the feature is the target's final (normed) hidden state, and the
  target's LM head turns the head's output into logits. Checkpoint: fc.weight (and fc.bias in the
  first releases), layers.N.*.
- EAGLE-3 (`Eagle3LlamaForCausalLM`): the feature is fc over three of the target's layers' inputs
  side by side (aux hidden states, layers 2, L/2 and L-3 unless the config names them); one layer
  (`midlayer`) whose attention reads [norm(embedding), norm(feature)] (2 x hidden wide); its own final
  norm and LM head over a smaller draft vocabulary, mapped to the target's by `d2t` (target id = draft
  id + d2t[draft id]). Checkpoint: fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d.

Both share the target's token embedding (a checkpoint's own copy is skipped), set by `share_target`.
They are built by the EAGLE proposer (spec_decode/eagle.py), not by architecture name: the published
configs name the target's architecture or one Tram does not register.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata
from tram.model.layers.embedding import LMHead
from tram.model.layers.linear import Linear
from tram.model.layers.mlp import GatedMLP
from tram.model.layers.norm import RMSNorm
from tram.model.layers.rope import RotaryEmbedding
from tram.model.models.base import resolve_backend, spec_attention
from tram.model.models.llama import LlamaDecoderLayer
from tram.model.spec import DecoderSpec


class _EagleHead(nn.Module):
    """What both heads share: the target they draft for, RoPE, and the forward's contract."""

    # The target's embedding is used; the checkpoint's copy (some releases carry one) is not loaded.
    missing_prefixes: tuple[str, ...] = ("embed_tokens.",)

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.spec = DecoderSpec.from_hf_config(hf_config)
        self.rotary_emb = RotaryEmbedding(hf_config, self.spec.head_dim)
        self._target: list[nn.Module] = []  # a list: the target is not a submodule (no parameters of its own)

    def share_target(self, target: nn.Module) -> None:
        self._target[:] = [target]

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    def target_feature(self, hidden: torch.Tensor, aux_hidden: torch.Tensor | None) -> torch.Tensor:
        """The feature the first pass reads from the target's step: [T, hidden]."""
        raise NotImplementedError

    def draft_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """The greedy token (target ids) each row's output predicts."""
        raise NotImplementedError


class EagleLlamaForCausalLM(_EagleHead):
    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__(hf_config)
        spec, backend = self.spec, resolve_backend(attention_backend)
        size = spec.hidden_size
        self.fc = Linear(2 * size, size, bias=bool(getattr(hf_config, "eagle_fc_bias", False)), dtype=dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, i, backend, dtype, False) for i in range(spec.num_layers))
        self.layers[0].input_layernorm = nn.Identity()  # the fc's output goes in unnormed
        for layer in self.layers:
            layer.cpu_decode = False  # the fused decode step assumes an input norm

    def target_feature(self, hidden: torch.Tensor, aux_hidden: torch.Tensor | None) -> torch.Tensor:
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        feature: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the LM head reads, the next pass's feature): the same tensor for EAGLE."""
        h = self.fc(torch.cat([self.target.model.embed(input_ids), feature], dim=-1))
        cos, sin = self.rotary_emb.cos_sin(positions, h.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer.forward_residual(h, residual, cos, sin, kv_cache, meta)
        out = h + residual
        return out, out

    def draft_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden).argmax(dim=-1)


class Eagle3Layer(nn.Module):
    """The checkpoint's `midlayer`: attention over [norm(embedding), norm(feature)], then the MLP."""

    def __init__(self, spec: DecoderSpec, backend: AttentionBackend, dtype: torch.dtype) -> None:
        super().__init__()
        norm = partial(RMSNorm, spec.hidden_size, spec.rms_norm_eps, dtype)
        self.input_layernorm, self.hidden_norm, self.post_attention_layernorm = norm(), norm(), norm()
        self.self_attn = spec_attention(spec, 0, backend, dtype, input_size=2 * spec.hidden_size)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act, spec.mlp_bias, dtype)

    def forward(
        self,
        embeds: torch.Tensor,
        feature: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)
        normed, residual = self.post_attention_layernorm.add_forward(
            self.self_attn(x, cos, sin, kv_cache, meta), feature
        )
        return self.mlp(normed), residual


class Eagle3LlamaForCausalLM(_EagleHead):
    missing_prefixes = ("embed_tokens.", "t2d")  # t2d: the reverse map, which drafting never reads

    def __init__(self, hf_config: Any, dtype: torch.dtype, attention_backend: AttentionBackend | str) -> None:
        super().__init__(hf_config)
        spec, backend = self.spec, resolve_backend(attention_backend)
        size = spec.hidden_size
        if spec.num_layers != 1:
            raise ValueError(f"an EAGLE-3 head has one layer (midlayer); this config says {spec.num_layers}")
        target_size = int(getattr(hf_config, "target_hidden_size", None) or size)
        self.fc = Linear(3 * target_size, size, bias=False, dtype=dtype)
        self.midlayer = Eagle3Layer(spec, backend, dtype)
        self.norm = RMSNorm(size, spec.rms_norm_eps, dtype)
        draft_vocab = int(getattr(hf_config, "draft_vocab_size", None) or spec.vocab_size)
        self.lm_head = LMHead(size, draft_vocab, dtype, tied=False)
        self.d2t = nn.Parameter(torch.zeros(draft_vocab, dtype=torch.int64), requires_grad=False)

    def target_feature(self, hidden: torch.Tensor, aux_hidden: torch.Tensor | None) -> torch.Tensor:
        assert aux_hidden is not None, "the target keeps its aux hidden states for an EAGLE-3 head"
        return self.fc(aux_hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        feature: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normed output the LM head reads, the unnormed one the next pass reads)."""
        cos, sin = self.rotary_emb.cos_sin(positions, feature.dtype)
        out, residual = self.midlayer(self.target.model.embed(input_ids), feature, cos, sin, kv_caches[0], meta)
        return self.norm.add_forward(out, residual)

    def draft_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        ids = self.lm_head(hidden, None).argmax(dim=-1)
        return ids + self.d2t[ids]


def aux_hidden_layers(head_config: Any, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head reads: the config's, else EAGLE-3's default."""
    named = getattr(head_config, "eagle_aux_hidden_state_layer_ids", None)
    if named:
        return tuple(int(i) for i in named)
    return (2, num_target_layers // 2, num_target_layers - 3)
