"""Repetition, frequency and presence penalties (vLLM's definitions).

Repetition scales the logits of tokens seen in the prompt or the output; frequency subtracts
`penalty * count` and presence `penalty * seen` for tokens of the output only. Only rows that use a
penalty are touched (the others keep bit-identical logits), and their state is kept across steps:
per penalised row, a [V] count of its output tokens (caught up at each step with the tokens sampled
since) and, for repetition, a [V] mask of its prompt tokens, computed once per request. Rebuilding
the batch's [P, V] tensors on a membership change reuses every surviving row's state.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tram.worker.logits_processors.base import LogitsProcessor, SamplingRow, host_to_device


def uses_penalties(r: SamplingRow) -> bool:
    p = r.params
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


@dataclass(eq=False)
class _RowState:
    row: SamplingRow  # held so that its id() cannot be reused while this entry exists
    counts: torch.Tensor  # [V] int32, this row's output token counts (a view into the batch tensor)
    num_counted: int  # how many of row.output_token_ids `counts` includes
    prompt_seen: torch.Tensor | None  # [V] bool (repetition only)


class PenaltiesProcessor(LogitsProcessor):
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        super().__init__(vocab_size, device)
        self._states: list[_RowState] = []
        self._rows: torch.Tensor | slice | None = None  # which batch rows are penalised
        self.output_counts: torch.Tensor | None = None  # [P, V] int32
        self.prompt_seen: torch.Tensor | None = None  # [P, V] bool, None unless a row uses repetition
        self.repetition: torch.Tensor | None = None  # [P] float32 (1.0 = neutral)
        self.frequency: torch.Tensor | None = None  # [P] float32
        self.presence: torch.Tensor | None = None  # [P] float32

    def update_rows(self, rows: Sequence[SamplingRow]) -> None:
        penalised = [(i, r) for i, r in enumerate(rows) if uses_penalties(r)]
        previous = {id(s.row): s for s in self._states}
        self._states = []
        if not penalised:
            self._rows = self.output_counts = self.prompt_seen = None
            return
        with_repetition = any(r.params.repetition_penalty != 1.0 for _, r in penalised)
        kept = [previous.get(id(r)) for _, r in penalised]
        counts = torch.stack([s.counts if s is not None else self._zeros(torch.int32) for s in kept])
        seen = None
        if with_repetition:
            seen = torch.stack([s.prompt_seen if s is not None and s.prompt_seen is not None
                                else self._prompt_mask(r) for s, (_, r) in zip(kept, penalised)])
        for j, (s, (_, r)) in enumerate(zip(kept, penalised)):
            self._states.append(_RowState(r, counts[j], s.num_counted if s is not None else 0,
                                          seen[j] if seen is not None else None))
        self.output_counts, self.prompt_seen = counts, seen
        index = [i for i, _ in penalised]
        contiguous = index == list(range(index[0], index[0] + len(index)))
        self._rows = slice(index[0], index[-1] + 1) if contiguous else host_to_device(index, torch.int64, self.device)
        params = [r.params for _, r in penalised]
        self.repetition = host_to_device([p.repetition_penalty for p in params], torch.float32, self.device)
        self.frequency = host_to_device([p.frequency_penalty for p in params], torch.float32, self.device)
        self.presence = host_to_device([p.presence_penalty for p in params], torch.float32, self.device)

    def _zeros(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.vocab_size, dtype=dtype, device=self.device)

    def _prompt_mask(self, r: SamplingRow) -> torch.Tensor:
        mask = self._zeros(torch.bool)
        mask[host_to_device(r.prompt_token_ids, torch.int64, self.device)] = True
        return mask

    @property
    def active(self) -> bool:
        return self._rows is not None

    def _catch_up(self) -> None:
        """Count the tokens each penalised row sampled since the last step: one scatter for all."""
        rows: list[int] = []
        tokens: list[int] = []
        for j, s in enumerate(self._states):
            out = s.row.output_token_ids
            if len(out) > s.num_counted:
                new = out[s.num_counted:]
                rows.extend([j] * len(new))
                tokens.extend(new)
                s.num_counted = len(out)
        if rows:
            assert self.output_counts is not None
            index = (host_to_device(rows, torch.int64, self.device), host_to_device(tokens, torch.int64, self.device))
            self.output_counts.index_put_(index, torch.ones(len(rows), dtype=torch.int32, device=self.device),
                                          accumulate=True)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        assert self._rows is not None and self.output_counts is not None
        self._catch_up()
        x = logits[self._rows]  # [P, V]
        counts = self.output_counts
        output_seen = counts > 0  # [P, V]
        if self.prompt_seen is not None:
            rep = self.repetition.unsqueeze(-1)  # [P, 1]
            # Dividing a positive logit and multiplying a negative one both make the token less likely.
            penalised = torch.where(x > 0, x / rep, x * rep)
            x = torch.where(output_seen | self.prompt_seen, penalised, x)
        x = x - self.frequency.unsqueeze(-1) * counts
        x = x - self.presence.unsqueeze(-1) * output_seen
        logits[self._rows] = x
        return logits
