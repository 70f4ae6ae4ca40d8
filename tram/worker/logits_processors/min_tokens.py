"""min_tokens: while a request has fewer outputs than min_tokens, its stop ids and eos ids are banned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


@dataclass
class TokenMask:
    """Sparse (row, token) pairs whose logit becomes -inf."""

    rows: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64


class MinTokensProcessor(LogitsProcessor):
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self._pending: list[tuple[int, SamplingRow]] = []  # rows that may still be below min_tokens
        self._masked_rows: tuple[int, ...] | None = None  # the rows `mask` was built for
        self.mask: TokenMask | None = None

    def uses(self, row: SamplingRow) -> bool:
        return bool(row.min_tokens_masked_ids) and len(row.output_token_ids) < row.params.min_tokens

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        self._pending = [(i, r) for i, r in enumerate(rows) if r.params.min_tokens > 0 and r.min_tokens_masked_ids]
        self._masked_rows = None
        self._refresh()

    def _refresh(self) -> None:
        # Outputs only grow, so a row that reached min_tokens leaves for good: the check costs
        # O(rows still below), and the mask is rebuilt only on the step a row leaves.
        self._pending = [(i, r) for i, r in self._pending if len(r.output_token_ids) < r.params.min_tokens]
        masked = tuple(i for i, _ in self._pending)
        if masked == self._masked_rows:
            return
        self._masked_rows = masked
        if not masked:
            self.mask = None
            return
        row_idx: list[int] = []
        token_ids: list[int] = []
        for i, r in self._pending:
            ids = sorted(r.min_tokens_masked_ids)
            row_idx.extend([i] * len(ids))
            token_ids.extend(ids)
        self.mask = TokenMask(
            to_device(row_idx, torch.int64, self.device), to_device(token_ids, torch.int64, self.device)
        )

    @property
    def active(self) -> bool:
        return bool(self._pending)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self._refresh()
        if self.mask is not None:
            logits[self.mask.rows, self.mask.token_ids] = float("-inf")
        return logits
