"""What every causal LM in Tram looks like to the model runner."""

from __future__ import annotations

import torch
from torch import nn

from tram.model.attention import AttentionBackend, AttentionMetadata, get_attention_backend
from tram.model.layers.embedding import LMHead, VocabEmbedding


def resolve_backend(attention_backend: AttentionBackend | str) -> AttentionBackend:
    return get_attention_backend(attention_backend) if isinstance(attention_backend, str) else attention_backend


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
