"""Whether the next step drafts: where verification pays, by measurement.

Verifying drafts turns a decode step of B tokens into one of B + D. Where a step costs about the same
either way (a small batch reads every weight once regardless) each accepted draft is a token for free;
where it does not (a large batch is compute-bound, and proposing for every row costs host time too)
drafts slow everyone down. Which regime a batch is in depends on the model, the machine and the
workload's acceptance, so the switch measures it: for each batch size (in powers of two) it keeps the
output tokens per second of the steps that drafted and of those that did not, recent steps weighing
most, and drafts where drafting has been faster. It tries each side a few times per batch size before
trusting it (one step is enough for a side that is clearly slower than the other), and the slower
side `explore_run` steps in `explore_every` afterwards, so a change in the workload is noticed;
never so often that trying it costs more than EXPLORE_COST of the throughput (a drafting step that
verifies five tokens a row in a compute-bound batch costs several plain ones). A proposer with a
model explores in runs: its first step back catches up, and only the steps between are measured.
At a batch size not seen yet, drafting is tried first unless it was clearly slower at the nearest
one measured. Speculation never changes a token (rejection_sampler.py), so
the choice moves only speed.
"""

from __future__ import annotations

import math

DECAY = 0.97  # per step of the same batch size and side: the last ~30 carry most of the weight
MIN_STEPS = 4  # steps each side runs at a batch size before the switch trusts its rate
WARMUP_STEPS = 1  # a side's first steps at a batch size pay one-time costs: not counted
SETTLED_STEPS = 16  # until the other side has this many, it is tried more often (explore_every / 4)
# ... unless it is this much slower already: a drafting step that verifies 5 tokens a row in a
# compute-bound batch costs several plain steps, and trying it often would cost more than it tells.
CLEAR_LOSS = 0.75
EXPLORE_COST = 0.03  # the share of the throughput that trying the slower side may cost
# ... once it is clearly slower: a gap that wide closes only when the workload changes, rarely.
CLEAR_COST = 0.01


class DraftSwitch:
    def __init__(self, explore_every: int = 32, explore_run: int = 1) -> None:
        self.explore_every = explore_every
        self.explore_run = explore_run
        # batch size bucket -> side (False: plain, True: drafting) -> [tokens, seconds, steps], decayed
        self._rates: dict[int, dict[bool, list[float]]] = {}
        self._asked: dict[int, int] = {}  # batch size bucket -> decisions made there

    @staticmethod
    def _bucket(num_rows: int) -> int:
        return max(num_rows, 1).bit_length()

    def record_step(self, num_rows: int, drafted: bool, num_tokens: int, seconds: float) -> None:
        """A step of num_rows rows (drafted: it was meant to verify drafts) produced num_tokens tokens."""
        sides = self._rates.setdefault(self._bucket(num_rows), {False: [0.0, 0.0, 0], True: [0.0, 0.0, 0]})
        tokens, spent, steps = sides[drafted]
        if steps < WARMUP_STEPS:
            sides[drafted][2] = steps + 1
            return
        sides[drafted] = [tokens * DECAY + num_tokens, spent * DECAY + seconds, steps + 1]

    def should_draft(self, num_rows: int) -> bool:
        """Whether the next step, of about num_rows rows, should verify drafts."""
        bucket = self._bucket(num_rows)
        asked = self._asked[bucket] = self._asked.get(bucket, 0) + 1
        sides = self._rates.get(bucket)
        if sides is None or sides[True][2] <= WARMUP_STEPS:
            below = self._clearly_slower_below(bucket)
            if below is not None:
                # Drafting lost clearly at a smaller batch: it loses here too (verification only gets
                # costlier as the batch grows); it is tried at the pace that ratio allows, not first.
                period = self._explore_period(below)
                return asked % period >= period - self.explore_run  # the first try one period in
        if sides is None:
            return self._first_side(bucket)
        # Each side a few steps first, unless it is clearly slower; the first side first.
        unmeasured = [
            side
            for side in (True, False)
            if sides[side][2] < WARMUP_STEPS + MIN_STEPS and not self._clearly_slower(sides, side)
        ]
        if unmeasured:
            return unmeasured[0] if len(unmeasured) == 1 else self._first_side(bucket)
        rates = {side: self._rate(sides[side]) for side in (True, False)}
        better = rates[True] >= rates[False]
        ratio = rates[not better] / rates[better] if rates[better] > 0 else 1.0
        clear = ratio < CLEAR_LOSS
        settled = sides[not better][2] >= WARMUP_STEPS + SETTLED_STEPS or clear
        every = self._explore_period(
            ratio, self.explore_every if settled else max(1, self.explore_every // 4), CLEAR_COST if clear else None
        )
        run = max(1, min(self.explore_run, every - 1))  # never the whole period
        return not better if asked % every < run else better

    def _explore_period(self, ratio: float, every: int | None = None, cost: float | None = None) -> int:
        """Steps between tries of a side `ratio` times as fast as the other: at least `every`, and
        enough that the tries cost at most `cost` (EXPLORE_COST) of the throughput."""
        every = self.explore_every if every is None else every
        if 0 < ratio < 1:
            every = max(every, math.ceil(self.explore_run * (1 / ratio - 1) / (cost or EXPLORE_COST)))
        return every

    def _clearly_slower_below(self, bucket: int) -> float | None:
        """Drafting's rate over plain decoding's at the largest smaller batch size where it was
        clearly slower (None: nowhere)."""
        for b in sorted((b for b in self._rates if b < bucket), reverse=True):
            sides = self._rates[b]
            if min(sides[s][2] for s in sides) > WARMUP_STEPS:
                ratio = self._rate(sides[True]) / max(self._rate(sides[False]), 1e-12)
                if ratio < CLEAR_LOSS:
                    return ratio
        return None

    def _first_side(self, bucket: int) -> bool:
        """Drafting is tried first at a new batch size, unless at the nearest one measured it was
        clearly slower (plain steps then come first: they are the cheap ones to measure)."""
        known = [b for b, sides in self._rates.items() if min(sides[s][2] for s in sides) > WARMUP_STEPS]
        if not known:
            return True
        sides = self._rates[min(known, key=lambda b: abs(b - bucket))]
        return not self._rate(sides[True]) < CLEAR_LOSS * self._rate(sides[False])

    def _clearly_slower(self, sides: dict[bool, list[float]], side: bool) -> bool:
        """One counted step of `side` was enough: the other side, measured, is much faster."""
        other = sides[not side]
        return (
            sides[side][2] > WARMUP_STEPS
            and other[2] >= WARMUP_STEPS + MIN_STEPS
            and self._rate(sides[side]) < CLEAR_LOSS * self._rate(other)
        )

    @staticmethod
    def _rate(side: list[float]) -> float:
        return side[0] / side[1] if side[1] > 0 else 0.0
