"""Repetition, frequency and presence penalties (vLLM's definitions).

Repetition scales the logits of tokens seen in the prompt or the output; frequency subtracts
`penalty * count` and presence `penalty * seen` for tokens of the output only. A token a row has
never seen keeps its logit, so only the seen ones are touched: per penalised row the processor
keeps a [V] count of its output tokens and a [V] mask of the tokens a penalty applies to (its
outputs, plus its prompt when it uses repetition), caught up each step with one scatter of the
tokens sampled since. The K touched positions are kept as flat indices (with each one's penalty
values) and only grow, by the positions a step's new tokens touch for the first time; a step
gathers those K logits, applies the penalties there with the same float32 operations a dense pass
would, and scatters them back: O(K) work instead of a dozen passes over [P, V]. Rebuilding on a
membership change reuses every surviving row's state; rows without penalties are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tram.worker.device_copy import to_device
from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow


def uses_penalties(r: SamplingRow) -> bool:
    p = r.params
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


@dataclass(eq=False)
class _RowState:
    row: SamplingRow  # held so that its id() cannot be reused while this entry exists
    counts: torch.Tensor  # [V] int32: this row's output token counts (a view into the batch tensor)
    touched: torch.Tensor  # [V] bool: the tokens a penalty applies to (a view into the batch tensor)
    num_counted: int  # how many of row.output_token_ids `counts` includes


class PenaltiesProcessor(LogitsProcessor):
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self._states: list[_RowState] = []
        self._first_row = 0  # penalised rows are batch rows first_row.. when contiguous,
        self._row_index: torch.Tensor | None = None  # else these batch rows
        self.output_counts: torch.Tensor | None = None  # [P, V] int32
        self.touched: torch.Tensor | None = None  # [P, V] bool
        self.any_repetition = False
        self.repetition: torch.Tensor | None = None  # [P] float32 (1.0 = neutral)
        self.frequency: torch.Tensor | None = None  # [P] float32
        self.presence: torch.Tensor | None = None  # [P] float32
        # The touched positions: flat indices into [P, V] and into the batch's [B, V] logits, and
        # each one's repetition, frequency and presence penalty; None until built.
        self._positions: dict[str, torch.Tensor] | None = None

    def uses(self, row: SamplingRow) -> bool:
        return uses_penalties(row)

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        penalised = [(i, r) for i, r in enumerate(rows) if uses_penalties(r)]
        previous = {id(s.row): s for s in self._states}
        self._states = []
        if not penalised:
            self.output_counts = self.touched = None
            return
        kept = [previous.get(id(r)) for _, r in penalised]
        self.output_counts = torch.stack([s.counts if s is not None else self._zeros(torch.int32) for s in kept])
        self.touched = torch.stack(
            [s.touched if s is not None else self._prompt_mask(r) for s, (_, r) in zip(kept, penalised)]
        )
        for j, (s, (_, r)) in enumerate(zip(kept, penalised)):
            self._states.append(_RowState(r, self.output_counts[j], self.touched[j], s.num_counted if s else 0))
        index = [i for i, _ in penalised]
        contiguous = index == list(range(index[0], index[0] + len(index)))
        self._first_row = index[0]
        self._row_index = None if contiguous else to_device(index, torch.int64, self.device)
        params = [r.params for _, r in penalised]
        self.any_repetition = any(p.repetition_penalty != 1.0 for p in params)
        self.repetition = to_device([p.repetition_penalty for p in params], torch.float32, self.device)
        self.frequency = to_device([p.frequency_penalty for p in params], torch.float32, self.device)
        self.presence = to_device([p.presence_penalty for p in params], torch.float32, self.device)
        self._positions = None
        self._catch_up()  # a new (or resumed) row brings the outputs it already has
        self._positions = self._index(self.touched.view(-1).nonzero().squeeze(-1))

    def _zeros(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.vocab_size, dtype=dtype, device=self.device)

    def _prompt_mask(self, r: SamplingRow) -> torch.Tensor:
        """A new row's touched mask: its prompt tokens if it uses repetition (the other penalties
        look at outputs only)."""
        mask = self._zeros(torch.bool)
        if r.params.repetition_penalty != 1.0:
            mask[to_device(r.prompt_token_ids, torch.int64, self.device)] = True
        return mask

    @property
    def active(self) -> bool:
        return self.output_counts is not None

    def _catch_up(self) -> None:
        """Count the tokens each penalised row sampled since the last step: one scatter for all."""
        rows: list[int] = []
        tokens: list[int] = []
        for j, s in enumerate(self._states):
            out = s.row.output_token_ids
            if len(out) > s.num_counted:
                new = out[s.num_counted :]
                rows.extend([j] * len(new))
                tokens.extend(new)
                s.num_counted = len(out)
        if not rows:
            return
        assert self.output_counts is not None and self.touched is not None
        row_t, token_t = to_device(rows, torch.int64, self.device), to_device(tokens, torch.int64, self.device)
        self.output_counts.index_put_(
            (row_t, token_t), torch.ones(len(rows), dtype=torch.int32, device=self.device), accumulate=True
        )
        if self._positions is not None:  # record the positions these tokens touch for the first time
            fresh = ~self.touched[row_t, token_t]
            new = torch.unique(row_t[fresh] * self.vocab_size + token_t[fresh])
            self._positions = {k: torch.cat((v, self._index(new)[k])) for k, v in self._positions.items()}
        self.touched[row_t, token_t] = True

    def _index(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """For flat positions into [P, V]: the same positions in the batch's logits and their penalties."""
        assert self.repetition is not None and self.frequency is not None and self.presence is not None
        penalised_row = flat // self.vocab_size
        batch_row = penalised_row + self._first_row if self._row_index is None else self._row_index[penalised_row]
        return {
            "flat": flat,
            "logits": batch_row * self.vocab_size + flat % self.vocab_size,
            "repetition": self.repetition[penalised_row],
            "frequency": self.frequency[penalised_row],
            "presence": self.presence[penalised_row],
        }

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.output_counts is not None
        self._catch_up()
        pos = self._positions
        assert pos is not None
        logits = logits.contiguous()  # flat indexing below; a no-op for the model's logits
        x = logits.view(-1).index_select(0, pos["logits"])  # [K]
        counts = self.output_counts.view(-1).index_select(0, pos["flat"])  # [K] int32
        if self.any_repetition:
            rep = pos["repetition"]
            # Dividing a positive logit and multiplying a negative one both make the token less likely.
            x = torch.where(x > 0, x / rep, x * rep)
        x = x - pos["frequency"] * counts
        x = x - pos["presence"] * (counts > 0)
        logits.view(-1).index_copy_(0, pos["logits"], x)
        return logits
