"""logit_bias: an additive bias on chosen token ids, per request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


@dataclass
class TokenBias:
    """Sparse (row, token) pairs with an additive bias."""

    rows: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32


class LogitBiasProcessor(LogitsProcessor):
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self.bias: TokenBias | None = None

    def uses(self, row: SamplingRow) -> bool:
        return bool(row.params.logit_bias)

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        row_idx: list[int] = []
        token_ids: list[int] = []
        values: list[float] = []
        for i, r in enumerate(rows):
            bias = r.params.logit_bias
            if bias:
                row_idx.extend([i] * len(bias))
                token_ids.extend(bias.keys())
                values.extend(bias.values())
        self.bias = (
            None
            if not row_idx
            else TokenBias(
                to_device(row_idx, torch.int64, self.device),
                to_device(token_ids, torch.int64, self.device),
                to_device(values, torch.float32, self.device),
            )
        )

    @property
    def active(self) -> bool:
        return self.bias is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        b = self.bias
        assert b is not None
        logits.index_put_((b.rows, b.token_ids), b.values, accumulate=True)
        return logits
