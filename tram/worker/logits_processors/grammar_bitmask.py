"""Structured outputs: the step's grammar bitmask bans every token a request's grammar does not allow.

Unlike the other processors its state is per step, not per batch: the engine core's matchers fill
the bitmask after scheduling (tram/structured_output/manager.py) and the model runner hands it over
with `set_step` before sampling. It runs first, so penalties, temperature and top-k/p only ever
see tokens the grammar allows. Rows without a constraint are untouched and a batch without one
skips it entirely.

A row that verifies drafts has a mask for each draft position too (the engine core's matcher steps
over the drafts to fill them): `draft_penalty` gives the rejection sampler those, and the row's own
mask, the one `apply` uses, is the one for the position after its last draft.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


class GrammarBitmaskProcessor(LogitsProcessor):
    masks_drafts = True

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self.rows: torch.Tensor | None = None  # [R] int64 batch rows with a constraint this step
        self.bitmask: torch.Tensor | None = None  # [R, words] int32
        self.byte_table = byte_penalty_table(device)
        # Batch row -> its masks [drafts + 1, words]: each draft position's, then the one after.
        self.drafted: dict[int, np.ndarray] = {}

    def uses(self, row: SamplingRow) -> bool:
        return row.params.structured_outputs is not None

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        """Membership changes do not matter: the bitmask comes with each step, keyed by request."""

    def set_step(self, rows: list[int] | None, bitmask: np.ndarray | None = None, num_rows: list[int] = ()) -> None:
        """The step's constrained batch rows and their bitmask rows; `num_rows` per batch row where
        some verify drafts (their draft positions' rows first, the row `apply` uses last)."""
        self.drafted = {}
        if not rows or bitmask is None:
            self.rows = self.bitmask = None
            return
        if num_rows:
            ends = np.cumsum(num_rows)
            self.drafted = {r: bitmask[e - n : e] for r, n, e in zip(rows, num_rows, ends) if n > 1}
            bitmask = bitmask[ends - 1]
        self.rows = to_device(rows, torch.int64, self.device)
        # A copy: the bitmask may be a read-only view of the message's bytes.
        self.bitmask = torch.from_numpy(np.array(bitmask, dtype=np.int32)).to(self.device, non_blocking=True)

    def draft_penalty(self, rows: list[int], counts: list[int], last: bool, vocab_size: int) -> torch.Tensor | None:
        """For drafted batch rows with `counts` drafts each: 0 / -inf over the vocabulary at every
        draft position ([sum(counts), V]), or with `last` at the position after each row's last
        draft ([len(rows), V]). None when no row has a grammar."""
        if not any(r in self.drafted for r in rows):
            return None
        words = next(iter(self.drafted.values())).shape[1]
        out = np.full((len(rows) if last else sum(counts), words), -1, dtype=np.int32)
        start = 0
        for i, (row, n) in enumerate(zip(rows, counts)):
            masks = self.drafted.get(row)
            if masks is not None:
                if last:
                    out[i] = masks[n]
                else:
                    out[start : start + n] = masks[:n]
            start += n
        return bitmask_penalty(torch.from_numpy(out).to(self.device), self.byte_table, vocab_size)

    @property
    def active(self) -> bool:
        return self.rows is not None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None and self.bitmask is not None
        penalty = bitmask_penalty(self.bitmask, self.byte_table, logits.shape[-1]).to(logits.dtype)
        # Adding 0 leaves a logit exactly as it was; adding -inf bans the token.
        return logits.index_add_(0, self.rows, penalty)


def byte_penalty_table(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: row b holds 0 where bit k of byte b is set, -inf where it is clear."""
    bits = (torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1  # [256, 8]
    return torch.where(bits.bool(), 0.0, float("-inf")).to(device)


def bitmask_penalty(bitmask: torch.Tensor, byte_table: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 -> [R, vocab_size] float32 of 0 (allowed) and -inf (banned).

    Bit j of word w is token 32*w + j; in the little-endian bytes of the words that is bit k of
    byte b for token 8*b + k, so one lookup per byte expands it, far cheaper than shifting every bit
    out of the words and masking with the result.
    """
    as_bytes = bitmask.contiguous().view(torch.uint8).long()  # [R, 4 * words]
    penalty = torch.nn.functional.embedding(as_bytes, byte_table)  # [R, 4 * words, 8]
    return penalty.view(bitmask.shape[0], -1)[:, :vocab_size]


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, words] int32 -> [R, vocab_size] bool (True: allowed); for tests and tools."""
    return bitmask_penalty(bitmask, byte_penalty_table(bitmask.device), vocab_size) == 0
