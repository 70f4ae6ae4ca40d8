"""The worker's side of speculative decoding, around one step: the scheduled drafts written after each
row's known tokens (so the step's inputs read them like any token), the logits that verify them, and
after sampling the proposer's drafts for the next step.

A drafted row's chunk is its last known token and its k drafts; the drafts are never counted in the
row's num_tokens, and the computed count moves back over the ones the step rejected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

import tram.envs as envs
from tram.config.speculative import SpeculativeConfig
from tram.core.sched_output import SchedulerOutput
from tram.spec_decode import make_proposer
from tram.spec_decode.budget import DraftSwitch
from tram.spec_decode.draft_model import Spans
from tram.worker.input_batch import InputBatch
from tram.worker.logits_processors import GrammarBitmaskProcessor, LogitsProcessor
from tram.worker.rejection_sampler import DraftRows
from tram.worker.step_inputs import StepInputs


def write_drafts(batch: InputBatch, spec: dict[str, list[int]]) -> np.ndarray | None:
    """Put each row's scheduled drafts after its known tokens; the draft count per row (None: none)."""
    if not spec:
        return None
    counts = np.zeros(batch.num_reqs, dtype=np.int64)
    for rid, drafts in spec.items():
        row = batch.row_of[rid]
        n = int(batch.num_tokens[row])
        batch.token_ids[row, n : n + len(drafts)] = drafts
        counts[row] = len(drafts)
    return counts


def logits_rows(counts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hidden rows a verification step needs logits for, in one LM-head call: each batch row's
    drafts' positions, then its last. A row whose chunk ends at hidden row e verifies draft j with
    the logits of hidden row e - k + j (they predict the token after each input). Returns (hidden
    rows, where each batch row's last is among them, which of them verify drafts)."""
    sizes = counts + 1
    stop = np.cumsum(sizes)
    rows = np.arange(int(stop[-1])) + np.repeat(ends - counts - (stop - sizes), sizes)
    drafts = np.ones(len(rows), dtype=bool)
    drafts[stop - 1] = False
    return rows, stop - 1, drafts


def drafted(batch: InputBatch, spec: dict[str, list[int]], counts: np.ndarray) -> tuple[list[int], list[list[int]]]:
    """The batch rows that verify drafts this step, and their drafts."""
    rows = np.flatnonzero(counts).tolist()
    return rows, [spec[batch.states[r].req_id] for r in rows]  # type: ignore[union-attr]


def draft_rows(batch: InputBatch, spec: dict[str, list[int]], counts: np.ndarray, logits: torch.Tensor) -> DraftRows:
    """The drafted rows, their drafts and their verifying logits ([sum of draft counts, V])."""
    return DraftRows(*drafted(batch, spec, counts), logits)


def grammar_masked(d: DraftRows, grammar: GrammarBitmaskProcessor) -> DraftRows:
    """The drafted rows as the rejection sampler must see them: a constrained row's positions under
    its grammar's mask for each (the raw logits stay in `d` for logprobs)."""
    counts = [len(x) for x in d.drafts]
    vocab = d.logits.shape[-1]
    penalty = grammar.draft_penalty(d.rows, counts, False, vocab)
    if penalty is None:
        return d
    last = None
    if d.last_logits is not None:
        last = d.last_logits + grammar.draft_penalty(d.rows, counts, True, vocab)  # type: ignore[operator]
    return dataclasses.replace(d, logits=d.logits + penalty, last_logits=last)


def roll_back(batch: InputBatch, counts: np.ndarray | None, produced: dict[int, int]) -> None:
    """After the step's computed counts advanced over whole chunks: back over each drafted row's
    rejected drafts (`produced`: the tokens each row got, accepted drafts plus one)."""
    if counts is None:
        return
    for row, n in produced.items():
        batch.num_computed_tokens[row] -= int(counts[row]) + 1 - n


class Drafter:
    """The proposer of a model runner and its switch (spec_decode/budget.py): after each step, drafts
    for the rows that sampled, where drafting has been paying at this batch size.

    A proposer with a model of its own (`batched`) runs the steps that propose, keeping its K/V
    beside the target's; steps that do not propose leave it alone (at a large batch size the switch
    turns drafting off, and the target then runs alone). `valid` remembers up to where each
    request's proposer K/V is right: a draft model catches up over the positions it missed before it
    proposes again; an EAGLE head cannot (it needs the target's features there), and a request it
    missed is not drafted again."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.proposer = make_proposer(config)
        self.batched = getattr(self.proposer, "batched", False)
        # A model proposer's first step back catches up: it explores three steps at a time.
        self.switch = DraftSwitch(explore_run=3 if self.batched else 1) if envs.TRAM_SPEC_DRAFT_SWITCH else None
        self.drafting = False  # whether the step being run verifies drafts (the last one proposed)
        self.proposing = False  # whether the step being run proposes at its end
        self.valid: dict[str, int] = {}

    def begin_step(self, batch: InputBatch, sched: SchedulerOutput) -> None:
        """Whether this step proposes: not from disable_by_batch_size requests on, nor where the
        switch says drafts do not pay at this batch size. A request computed again after preemption
        starts over."""
        self.drafting = self.proposing
        limit = self.config.disable_by_batch_size
        self.proposing = (limit is None or batch.num_reqs < limit) and (
            self.switch is None or self.switch.should_draft(batch.num_reqs)
        )
        for cached in sched.scheduled_cached_reqs:
            if cached.resumed_from_preemption:
                self.valid.pop(cached.req_id, None)
        if len(self.valid) > 2 * batch.num_reqs + 64:  # finished requests' entries
            live = set(batch.req_ids)
            self.valid = {rid: n for rid, n in self.valid.items() if rid in live}

    def run_step(self, batch: InputBatch, sched: SchedulerOutput, inputs: StepInputs, hidden: torch.Tensor) -> None:
        """The target's step done (computed counts not yet advanced): a proposer with a model runs
        it too, or keeps the features, if this step proposes; else its requests miss the step."""
        if not self.batched:
            return
        n, ids = batch.num_reqs, batch.req_ids
        start = batch.num_computed_tokens[:n].astype(np.int64)
        end = start + np.fromiter((sched.num_scheduled_tokens[r] for r in ids), dtype=np.int64, count=n)
        # A request first seen: a draft model trusts nothing (a prefix-cache hit may hold blocks it
        # never ran); an EAGLE head trusts the hit, which it cannot recompute.
        fresh = 0 if self.proposer.catches_up else start
        valid = np.minimum(np.fromiter((self.valid.get(rid, -1) for rid in ids), dtype=np.int64, count=n), start)
        valid = np.where(valid < 0, fresh, valid)
        if not self.proposing:  # the step's positions are missed: the valid counts stay where they are
            self.valid.update(zip(ids, valid.tolist()))
            return
        missed = valid < start
        catch_up = None
        if missed.any() and self.proposer.catches_up:
            catch_up = _spans(batch, valid, end)
            missed[:] = False
        self.proposer.run_step(inputs.input_ids, inputs.positions, inputs.meta, hidden, catch_up)
        self.valid.update(zip(ids, np.where(missed, valid, end).tolist()))

    def after_step(self, batch: InputBatch, inputs: StepInputs) -> None:
        """The step's tokens sampled and appended: an EAGLE head's pass over them."""
        if self.batched and self.proposing:
            self.proposer.after_step(batch.token_ids, inputs.token_rows, inputs.token_positions)

    def propose(
        self, batch: InputBatch, rows: Sequence[int], processors: Sequence[LogitsProcessor]
    ) -> dict[str, list[int]]:
        """Drafts for the rows that sampled whose sampling no logits processor touches (but one that
        masks drafts itself: the grammar's), if this step proposes; with a model, for the rows whose
        proposer K/V is whole."""
        if not self.proposing:
            return {}
        touch = [p for p in processors if p.active and not p.masks_drafts]
        eligible = [r for r in rows if not any(p.uses(batch.states[r].sampling) for p in touch)] if touch else rows  # type: ignore[union-attr]
        if self.batched:
            ids = batch.req_ids
            whole = [r for r in eligible if self.valid.get(ids[r], -1) >= batch.num_computed_tokens[r]]
            return self._propose_batched(batch, whole)
        out: dict[str, list[int]] = {}
        for row in eligible:
            n = int(batch.num_tokens[row])
            drafts = self.proposer.propose(batch.token_ids[row, :n], batch.max_model_len - n)
            if drafts:
                out[batch.states[row].req_id] = drafts  # type: ignore[union-attr]
        return out

    def _propose_batched(self, batch: InputBatch, rows: list[int]) -> dict[str, list[int]]:
        """Every row's drafts from one proposer call: up to k each, none past the context."""
        ends = batch.num_tokens[rows].astype(np.int64)
        room = np.minimum(batch.max_model_len - ends, self.config.num_speculative_tokens)
        keep = room > 0
        if not keep.any():
            return {}
        rows, ends, room = [r for r, k in zip(rows, keep) if k], ends[keep], room[keep]
        drafts = self.proposer.propose_batch(
            np.array(rows, dtype=np.int64),
            batch.token_ids[rows, ends - 1],
            ends - 1,
            batch.block_table.groups[0].np[rows],
            int(room.max()),
            batch.max_model_len - 1,
        )
        return {
            batch.states[r].req_id: drafts[i, : room[i]].tolist()  # type: ignore[union-attr]
            for i, r in enumerate(rows)
        }

    def record(self, num_rows: int, drafted: bool, num_tokens: int, seconds: float) -> None:
        """A step's rows, whether it was asked to verify drafts, the tokens it produced and its time.
        A model proposer's steps between regimes (proposing without verifying, or the reverse) are
        neither side's: they are not counted."""
        if self.batched and self.drafting != self.proposing:
            return
        if self.switch is not None:
            self.switch.record_step(num_rows, drafted, num_tokens, seconds)


def _spans(batch: InputBatch, start: np.ndarray, end: np.ndarray) -> Spans:
    """Every row's positions [start, end), with the batch's tokens there (the step's drafts included)."""
    q = end - start
    cu = np.cumsum(q)
    rows = np.repeat(np.arange(len(q)), q)
    positions = np.arange(int(cu[-1])) - np.repeat(cu - q - start, q)
    return Spans(batch.token_ids[rows, positions], start, end, batch.block_table.groups[0].np[: len(q)])
