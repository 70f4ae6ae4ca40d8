"""Token embedding (optionally scaled, as Gemma's) and the LM head that turns hidden states into logits
(tied to the embedding or its own weight, optionally soft-capped)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tram.distributed import get_tp, tp_all_gather, tp_all_reduce
from tram.model.kernels.cpu_kernels import to_float32
from tram.model.layers.cpu_packed import PairPacked
from tram.model.layers.linear import linear
from tram.model.layers.parallel_linear import slice_loader
from tram.model.weight_utils import set_weight_loader


def vocab_shard(vocab_size: int) -> tuple[int, int]:
    """(first token id, rows) of this rank's vocabulary shard: ceil(vocab / tp) rows each, the last
    shard padded with zero rows past the vocabulary (as vLLM's VocabParallelEmbedding)."""
    tp = get_tp()
    rows = -(-vocab_size // tp.size)
    return tp.rank * rows, rows


class VocabEmbedding(nn.Embedding):
    """nn.Embedding (same parameter name) whose rows may be multiplied by a normaliser.

    Gemma multiplies by sqrt(hidden_size) rounded to the activation dtype first (a float32 tensor cast
    to the weight's dtype in transformers); the product is then rounded once, as a scalar multiply
    rounds it. The normaliser is a Python float, not a buffer: no device copy and graph-capture safe.

    Under tensor parallelism each rank holds a shard of the rows (vocab_shard); a token outside it
    embeds as zeros and one all-reduce sums the ranks' rows, exactly (one term is not zero).

    `quant` holds the weight in fewer bits where a GGUF file kept it quantized (`weight` is then
    empty): only the rows looked up are dequantized.
    """

    quant: Any = None

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, scale: float | None = None) -> None:
        self.vocab_start, rows = vocab_shard(vocab_size)
        super().__init__(rows, hidden_size, dtype=dtype)
        self.vocab_end = min(vocab_size, self.vocab_start + rows)
        self.sharded = rows != vocab_size
        if self.sharded:
            set_weight_loader(self.weight, slice_loader(0, self.vocab_start, rows, vocab_size))
        self.normalizer = None if scale is None else _round_to(scale, dtype)

    def reset_parameters(self) -> None:
        # Models are built on the meta device and filled from the checkpoint. A meta tensor has no
        # values to draw, and drawing them anyway goes through torch's reference ops, whose first
        # use imports torch._dynamo: most of a second of every engine and worker process's start.
        if self.weight.device.type != "meta":
            super().reset_parameters()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        if self.quant is not None:
            h = self.quant.embedding(input_ids, self.weight.dtype)
        elif self.sharded:
            h = self._sharded_embedding(input_ids)
        else:
            h = F.embedding(input_ids, self.weight)
        return h if self.normalizer is None else h * self.normalizer

    def _sharded_embedding(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [T]
        h = F.embedding(torch.where(mine, input_ids - self.vocab_start, 0), self.weight)  # [T, hidden]
        return tp_all_reduce(h.masked_fill_(~mine.unsqueeze(-1), 0))


def _round_to(value: float, dtype: torch.dtype) -> float:
    """value rounded to float32 then to dtype, as transformers' float32 buffer cast to the weight dtype."""
    # On the CPU explicitly: models are built under a meta device context, and meta tensors hold no values.
    return float(torch.tensor(value, dtype=torch.float32, device="cpu").to(dtype))


class LMHead(nn.Module):
    """Logits from final hidden states: [N, hidden] -> [N, vocab] float32.

    Untied, it owns `weight` (the checkpoint's lm_head.weight, when placed at model.lm_head); tied, it
    owns nothing and is handed the embedding's weight. final_logit_softcapping c maps logits to
    c * tanh(logits / c) in the activation dtype before the float32 cast, as transformers does;
    logits_scaling s (Granite) divides them by s first, in the activation dtype too.

    Under tensor parallelism the weight is a vocabulary shard (vocab_shard, as the embedding's) and
    the ranks' logits are gathered before sampling, so every rank samples from the same logits.
    `quant` is an untied head's weight kept quantized (a GGUF file); tied, the embedding's is used.
    """

    quant: Any = None
    # One row of x per sequence of a step: cpu_packed packs the weight for few rows (pack_few_rows).
    few_rows = True

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        tied: bool,
        final_logit_softcapping: float | None = None,
        logits_scaling: float | None = None,
    ) -> None:
        super().__init__()
        self.tied = tied
        self.softcap = final_logit_softcapping
        self.logits_scaling = logits_scaling
        self.vocab_size = vocab_size
        start, rows = vocab_shard(vocab_size)
        self.sharded = rows != vocab_size
        if not tied:
            self.weight = nn.Parameter(torch.empty(rows, hidden_size, dtype=dtype))  # [vocab / tp, hidden]
            if self.sharded:
                set_weight_loader(self.weight, slice_loader(0, start, rows, vocab_size))
        # packed copy of the weight multiplied by (the embedding's when tied: oneDNN's layout, or pairs of
        # k), set after loading on CPU by cpu_packed.pack_cpu_linears; no parameter, so loading never sees it.
        self.packed_weight: torch.Tensor | PairPacked | None = None

    def forward(self, hidden: torch.Tensor, embedding: VocabEmbedding) -> torch.Tensor:
        quant = embedding.quant if self.tied else self.quant
        if quant is not None:
            logits = quant.apply(hidden, None)  # [N, vocab]
        else:
            logits = linear(hidden, embedding.weight if self.tied else self.weight, None, self.packed_weight)
        if self.sharded:  # [N, vocab / tp] -> [N, vocab]
            logits = tp_all_gather(logits)
            if logits.shape[-1] != self.vocab_size:
                logits = logits[:, : self.vocab_size].contiguous()
        if self.logits_scaling is not None:
            logits = logits / self.logits_scaling
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return to_float32(logits)
