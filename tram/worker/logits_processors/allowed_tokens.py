"""allowed_token_ids: a request may only sample from its own list of token ids (vLLM's field)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


class AllowedTokenIdsProcessor(LogitsProcessor):
    """Keeps a dense [R, V] "banned" mask for the R rows that restrict their tokens.

    The mask is built only when the batch's membership changes; a step costs one masked_fill over
    those rows. Dense because an allow-list bans almost the whole vocabulary: sparse pairs would be
    V - len(allowed) per row.
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self.rows: torch.Tensor | None = None  # [R] int64 batch rows that restrict
        self.banned: torch.Tensor | None = None  # [R, V] bool

    def uses(self, row: SamplingRow) -> bool:
        return bool(row.params.allowed_token_ids)

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        restricted = [(i, r.params.allowed_token_ids) for i, r in enumerate(rows) if r.params.allowed_token_ids]
        if not restricted:
            self.rows = self.banned = None
            return
        banned = torch.ones(len(restricted), self.vocab_size, dtype=torch.bool)
        for j, (_, allowed) in enumerate(restricted):
            banned[j, torch.tensor(allowed, dtype=torch.int64)] = False
        self.rows = to_device([i for i, _ in restricted], torch.int64, self.device)
        self.banned = banned.to(self.device)

    @property
    def active(self) -> bool:
        return self.rows is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None and self.banned is not None
        logits[self.rows] = logits[self.rows].masked_fill(self.banned, float("-inf"))
        return logits
