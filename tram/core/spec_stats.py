"""Speculative decoding's running totals, as vLLM counts them: drafts verified, draft tokens, accepted
tokens, and how often the draft at each position was accepted (position i counts only where every
draft before it was accepted too)."""

from __future__ import annotations

from tram.core.outputs import SpecDecodingCounts


class SpecDecodingStats:
    def __init__(self) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: `num_accepted` of its `num_draft_tokens` drafts, from the first."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1

    def snapshot(self) -> SpecDecodingCounts | None:
        """The totals so far; None before the first draft (an engine without speculation sends none)."""
        if self.num_drafts == 0:
            return None
        return SpecDecodingCounts(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, list(self.accepted_per_pos)
        )
