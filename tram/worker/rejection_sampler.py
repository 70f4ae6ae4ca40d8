"""Verifies a step's draft tokens against the target model so that speculation never changes what a
request produces.

A drafted row ran its last known token and its k drafts through the model in one chunk: the logits
at chunk position j give the distribution p_j of the token after it, which draft j must match.
Each position's token is drawn exactly as the sampler draws it without speculation, and the drafts
are accepted from the first for as long as they equal those draws; the row ends with the first draw
that differs, or past the last draft (all accepted) with the draw at position k ("the bonus token").

  greedy   the draw is the argmax of p_j
  random   the draw is the sampler's exponential race, argmax(p_j / E) with E ~ Exponential(1)
           over the same temperature, top-k and top-p: token i with probability p_j(i)

A draft is then accepted with probability p_j(d), and a rejected position's token follows p_j
without d, renormalised: Leviathan et al.'s rule for a proposer that drafts with certainty (q_j = 1
on its draft, as n-gram lookup does), so every output token follows the target model's distribution.
Coupling the acceptance to the draw itself (instead of to a separate uniform) goes one step further:
a position's token depends only on its logits and its noise, never on whether the step drafted.
Seeded rows draw each position's noise from their own generator in position order, stopping at the
first rejection, so the generator is left where plain decoding would leave it: a seeded request gives
the same tokens with speculation as without, however many drafts each step verified.

Rows that a logits processor touches are never drafted (the processors' state covers one position per
row; the ordinary sampler served them), but for the grammar's: its engine core fills a mask for each
draft position, and the logits here come masked (spec_step.grammar_masked), so every accepted draft
and every draw is one the grammar allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.kernels.cpu_kernels import argmax_rows
from tram.sampling_params import SAMPLING_EPS
from tram.worker.sampler import apply_top_k_top_p, exponential_race
from tram.worker.sampling_metadata import SamplingMetadata


@dataclass
class DraftRows:
    """The drafted rows of a step: their batch rows, drafts, and the logits that verify them."""

    rows: list[int]  # batch rows with at least one draft
    drafts: list[list[int]]  # per drafted row
    logits: torch.Tensor  # [sum of draft counts, V] float32, each row's positions in order
    # [len(rows), V] each row's logits past its last draft (the bonus position); read for seeded rows
    last_logits: torch.Tensor | None = None


def verify_drafts(d: DraftRows, bonus: list[int], meta: SamplingMetadata) -> list[list[int]]:
    """Per drafted row: its accepted drafts and one token more. `bonus`: the sampler's draw past
    each row's last draft, used where all were accepted (seeded rows draw their own, in order)."""
    if meta.all_greedy:
        return accept_drafts(d.drafts, argmax_rows(d.logits).tolist(), bonus)
    counts = [len(x) for x in d.drafts]
    owner = torch.repeat_interleave(torch.tensor(d.rows), torch.tensor(counts))  # [D] batch row of each position
    probs = target_probs(d.logits, meta, owner)
    drawn = exponential_race(probs, {}).tolist()  # unseeded rows' draws (greedy rows' are replaced)
    if meta.temperature is not None:
        greedy = (meta.temperature[owner] < SAMPLING_EPS).tolist()
        if any(greedy):
            best = argmax_rows(d.logits).tolist()
            drawn = [b if g else x for b, g, x in zip(best, greedy, drawn)]
    out = accept_drafts(d.drafts, drawn, bonus)
    seeded = [i for i, row in enumerate(d.rows) if row in meta.generators]
    if seeded:
        _seeded_draws(d, meta, probs, counts, seeded, out)
    return out


def accept_drafts(drafts: list[list[int]], drawn: list[int], bonus: list[int]) -> list[list[int]]:
    """Each row's drafts kept while they equal the draws at their positions (`drawn`: every row's in
    order), then the first draw that differs, or the bonus token."""
    out, start = [], 0
    for row_drafts, last in zip(drafts, bonus):
        draws = drawn[start : start + len(row_drafts)]
        start += len(row_drafts)
        n = next((j for j, (t, x) in enumerate(zip(draws, row_drafts)) if t != x), len(row_drafts))
        out.append(row_drafts[:n] + ([draws[n]] if n < len(row_drafts) else [last]))
    return out


def target_probs(logits: torch.Tensor, meta: SamplingMetadata, owner: torch.Tensor) -> torch.Tensor:
    """The distribution the sampler draws from at each position ([D, V]): the owner row's temperature,
    top-k and top-p (greedy positions get temperature 1 and are not read)."""
    assert meta.temperature is not None
    temperature = meta.temperature[owner]
    temperature = torch.where(temperature < SAMPLING_EPS, torch.ones_like(temperature), temperature)
    scaled = logits / temperature.unsqueeze(-1)
    top_k = meta.top_k[owner] if meta.top_k is not None else None
    top_p = meta.top_p[owner] if meta.top_p is not None else None
    if top_k is not None or top_p is not None:
        scaled = apply_top_k_top_p(scaled, top_k, top_p, meta.max_top_k)
    return torch.softmax(scaled, dim=-1)


def _seeded_draws(
    d: DraftRows,
    meta: SamplingMetadata,
    probs: torch.Tensor,
    counts: list[int],
    seeded: list[int],
    out: list[list[int]],
) -> None:
    """A seeded row's positions drawn one at a time from its generator until a draw differs from its
    draft, the bonus position last: the noise each token uses is the one plain decoding gives it."""
    assert d.last_logits is not None, "seeded rows need the logits past their last draft"
    starts = [sum(counts[:i]) for i in range(len(counts))]
    for i in seeded:
        gen = meta.generators[d.rows[i]]
        got: list[int] = []
        for j, draft in enumerate(d.drafts[i]):
            token = int(exponential_race(probs[starts[i] + j : starts[i] + j + 1], {0: gen}))
            got.append(token)
            if token != draft:
                break
        else:
            row = torch.tensor([d.rows[i]])
            last = target_probs(d.last_logits[i : i + 1], meta, row)
            got.append(int(exponential_race(last, {0: gen})))
        out[i] = got
