"""min_p: drop tokens whose probability is below min_p times the row's top probability.

It cannot change the argmax, so it runs after temperature, on the logits rows are sampled from."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow, Stage


class MinPProcessor(LogitsProcessor):
    stage = Stage.AFTER_TEMPERATURE

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self.min_p: torch.Tensor | None = None  # [B] float32, 0.0 where disabled

    def uses(self, row: SamplingRow) -> bool:
        return row.params.min_p > 0.0

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        # Greedy rows have min_p normalised to 0 by SamplingParams.
        values = [r.params.min_p for r in rows]
        self.min_p = to_device(values, torch.float32, self.device) if any(v > 0.0 for v in values) else None

    @property
    def active(self) -> bool:
        return self.min_p is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.min_p is not None
        probs = torch.softmax(logits, dim=-1)  # [B, V]
        threshold = probs.amax(dim=-1, keepdim=True) * self.min_p.unsqueeze(-1)  # [B, 1]
        return logits.masked_fill(probs < threshold, float("-inf"))
