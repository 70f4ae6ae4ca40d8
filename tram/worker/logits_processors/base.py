"""The contract of a logits processor: one sampling feature that owns its tensors over the batch.

The persistent batch calls `update_rows(rows)` whenever its membership or row order changes, with
every row's `SamplingRow` in batch order. A row's `output_token_ids` list grows in place as the
request generates, so a processor whose state depends on the outputs so far (min_tokens, penalties)
reads it at `apply` time and keeps its tensors current with work proportional to what changed.
`apply(logits)` edits the step's logits [B, V] (row i belongs to rows[i]) and returns them; the
sampler skips a processor while `active` is False (no row uses it).

Processors run in the order of `LOGITS_PROCESSORS` (tram/worker/logits_processors/__init__.py):
those of the BEFORE_ARGMAX stage can change the greedy pick, so they run before it; the
AFTER_TEMPERATURE ones (min_p) cannot, and see the temperature-scaled logits of sampled rows.
Adding a sampling feature is one class here plus one SamplingParams field.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from tram.sampling_params import SamplingParams


class Stage(enum.Enum):
    BEFORE_ARGMAX = enum.auto()
    AFTER_TEMPERATURE = enum.auto()


@dataclass(eq=False)
class SamplingRow:
    """What the sampler knows about one request in the batch. The worker appends to
    `output_token_ids` in place as tokens are sampled; processors hold the object across steps."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    # Seeded requests only. Seeded once and kept across steps, so that the request's noise stream
    # does not depend on which other requests share the batch.
    generator: torch.Generator | None = None
    # Masked while the request has fewer than min_tokens outputs: its stop_token_ids and every eos id.
    min_tokens_masked_ids: frozenset[int] = frozenset()


class LogitsProcessor:
    stage: ClassVar[Stage] = Stage.BEFORE_ARGMAX
    # Whether a row it touches may verify drafts: the processor can mask each draft position itself.
    masks_drafts: ClassVar[bool] = False

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        raise NotImplementedError

    @property
    def active(self) -> bool:
        raise NotImplementedError

    def uses(self, row: SamplingRow) -> bool:
        """Whether apply() may change this row's logits: speculative decoding verifies drafts only
        for rows that no processor touches (a processor reads the outputs up to one position),
        unless it `masks_drafts`."""
        raise NotImplementedError

    def apply(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] float32 -> [B, V]
        raise NotImplementedError
