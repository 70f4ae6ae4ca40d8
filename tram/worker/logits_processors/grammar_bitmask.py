"""Structured outputs: the step's grammar bitmask bans every token a request's grammar does not allow.

Unlike the other processors its state is per step, not per batch: the engine core's matchers fill
the bitmask after scheduling (tram/structured_output/manager.py) and the model runner hands it over
with `set_step` before sampling. It runs first, so penalties, temperature and top-k/p only ever
see tokens the grammar allows. Rows without a constraint are untouched and a batch without one
skips it entirely.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


class GrammarBitmaskProcessor(LogitsProcessor):
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self.rows: torch.Tensor | None = None  # [R] int64 batch rows with a constraint this step
        self.bitmask: torch.Tensor | None = None  # [R, words] int32
        self.shifts = torch.arange(32, dtype=torch.int32, device=device)

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        """Membership changes do not matter: the bitmask comes with each step, keyed by request."""

    def set_step(self, rows: list[int] | None, bitmask: np.ndarray | None = None) -> None:
        if not rows or bitmask is None:
            self.rows = self.bitmask = None
            return
        self.rows = to_device(rows, torch.int64, self.device)
        # A copy: the bitmask may be a read-only view of the message's bytes.
        self.bitmask = torch.from_numpy(np.array(bitmask, dtype=np.int32)).to(self.device, non_blocking=True)

    @property
    def active(self) -> bool:
        return self.rows is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None and self.bitmask is not None
        allowed = unpack_bitmask(self.bitmask, self.shifts, logits.shape[-1])
        logits[self.rows] = logits[self.rows].masked_fill(~allowed, float("-inf"))
        return logits


def unpack_bitmask(bitmask: torch.Tensor, shifts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 -> [R, vocab_size] bool; bit j of word w is token 32*w + j."""
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, words, 32]
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
