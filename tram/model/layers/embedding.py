"""Token embedding (optionally scaled, as Gemma's) and the LM head that turns hidden states into logits
(tied to the embedding or its own weight, optionally soft-capped)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tram.model.cpu_kernels import to_float32
from tram.model.linear import linear


class VocabEmbedding(nn.Embedding):
    """nn.Embedding (same parameter name) whose rows may be multiplied by a normaliser.

    Gemma multiplies by sqrt(hidden_size) rounded to the activation dtype first (a float32 tensor cast
    to the weight's dtype in transformers); the product is then rounded once, as a scalar multiply
    rounds it. The normaliser is a Python float, not a buffer: no device copy and graph-capture safe.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, scale: float | None = None) -> None:
        super().__init__(vocab_size, hidden_size, dtype=dtype)
        self.normalizer = None if scale is None else _round_to(scale, dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        h = F.embedding(input_ids, self.weight)
        return h if self.normalizer is None else h * self.normalizer


def _round_to(value: float, dtype: torch.dtype) -> float:
    """value rounded to float32 then to dtype, as transformers' float32 buffer cast to the weight dtype."""
    # On the CPU explicitly: models are built under a meta device context, and meta tensors hold no values.
    return float(torch.tensor(value, dtype=torch.float32, device="cpu").to(dtype))


class LMHead(nn.Module):
    """Logits from final hidden states: [N, hidden] -> [N, vocab] float32.

    Untied, it owns `weight` (the checkpoint's lm_head.weight, when placed at model.lm_head); tied, it
    owns nothing and is handed the embedding's weight. final_logit_softcapping c maps logits to
    c * tanh(logits / c) in the activation dtype before the float32 cast, as transformers does.
    """

    def __init__(self, hidden_size: int, vocab_size: int, dtype: torch.dtype, tied: bool,
                 final_logit_softcapping: float | None = None) -> None:
        super().__init__()
        self.tied = tied
        self.softcap = final_logit_softcapping
        if not tied:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype))  # [vocab, hidden]
        # oneDNN-packed copy of the weight multiplied by (the embedding's when tied), set after loading
        # on CPU by cpu_packed.pack_cpu_linears; no parameter, so loading never sees it.
        self.packed_weight: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor, embedding: VocabEmbedding) -> torch.Tensor:
        logits = linear(hidden, embedding.weight if self.tied else self.weight, None, self.packed_weight)  # [N, vocab]
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return to_float32(logits)
