"""One constrained request's grammar: a compile in flight until it is ready, then its matcher.

The scheduler (tram/core, torch-free) sees only `is_ready` and `is_terminated`; the engine core's
manager advances it with `accept_token` after each step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import KIND_NAMES, GrammarBackend, GrammarCompileError, Matcher
from tram.structured_output.compile_queues import too_long_message

logger = logging.getLogger(__name__)


class StructuredOutputRequest:
    def __init__(
        self, params: StructuredOutputsParams, compiled: Future, backend: GrammarBackend, deadline: float
    ) -> None:
        self.params = params
        self.compiled = compiled
        self.backend = backend
        self.deadline = deadline  # time.monotonic() by which the grammar must be compiled
        self.matcher: Matcher | None = None
        self.rejected = False  # a sampled token the grammar did not allow (see accept_token)
        self.error: GrammarCompileError | None = None  # the grammar broke off: the request fails
        self.last_token: int | None = None
        # A thinking model's constraint waits for the tokens that end its thinking (vLLM's behaviour):
        # until then no bitmask, no token acceptance, no end.
        self.reasoning_end = list(params.reasoning_end or ())
        self.thinking = bool(self.reasoning_end)
        self._recent: list[int] = []  # the last tokens while thinking, to spot the end

    def is_ready(self) -> bool:
        if self.matcher is not None:
            return True
        if not self.compiled.done() or self.compiled.exception() is not None:
            return False
        self.matcher = self.backend.matcher(self.compiled.result())
        return True

    def failure(self, now: float | None = None) -> GrammarCompileError | None:
        """Why this request can never start: the engine refused its constraint, or compiling took
        longer than the deadline (only this request fails; the compile ends once no request waits for it)."""
        if self.compiled.done():
            e = self.compiled.exception()
            if e is None:
                return None
            # The compile may be shared with a request that named another field: name this one's.
            reason = e.args[0] if isinstance(e, GrammarCompileError) else f"could not compile it: {e}"
            return GrammarCompileError(self.field, f"{self.field}: {reason}")
        if (time.monotonic() if now is None else now) > self.deadline:
            return GrammarCompileError(self.field, f"{self.field}: {too_long_message(self.params.kind)}")
        return None

    @property
    def field(self) -> str:
        return self.params.source_field or "structured_outputs"

    def fill_bitmask(self, bitmask: np.ndarray, row: int, drafts: Sequence[int] = ()) -> None:
        """Row `row` for the next token; with drafts, a row more for the position after each (the
        matcher steps over them and back). Rows past a draft the grammar refuses, or past a stop
        token, repeat the one before: the verification never reads them (the request cannot go on)."""
        assert self.matcher is not None
        self.matcher.fill_bitmask(bitmask, row)
        valid = self.matcher.count_valid(list(drafts)) if drafts else 0
        for j, token in enumerate(drafts[:valid], 1):
            self.matcher.accept_token(token)
            # Past a stop token nothing is allowed (xgrammar will not even fill the row): never read.
            stopped = self.matcher.is_terminated() and token in self.backend.stop_token_ids
            if not stopped:
                self.matcher.fill_bitmask(bitmask, row + j)
            if stopped or not bitmask[row + j].any():
                bitmask[row + j] = bitmask[row + j - 1]
        bitmask[row + valid + 1 : row + len(drafts) + 1] = bitmask[row + valid]
        self.matcher.rollback(valid)

    def valid_drafts(self, drafts: list[int]) -> int:
        """How many of the proposer's drafts the request may verify: those its grammar accepts in
        turn, up to its end; while thinking, those before the one that would end the thinking (the
        grammar binds every position after it, and verification masks only from the next step)."""
        assert self.matcher is not None
        if self.thinking:
            recent = self._recent
            for j, token in enumerate(drafts):
                recent = (recent + [token])[-len(self.reasoning_end) :]
                if recent == self.reasoning_end:
                    return j
            return len(drafts)
        return self.matcher.count_valid(drafts)

    def accept_token(self, token_id: int) -> bool:
        assert self.matcher is not None
        if self.thinking:
            self._watch_thinking(token_id)
            return True
        self.last_token = token_id
        ok = self.matcher.accept_token(token_id)
        if ok:
            return True
        reason = self.matcher.refusal()
        if reason is None:
            # Every allowed token was masked by something else (min_tokens banning the grammar's
            # stop token) once the output was whole: the request ends rather than go past it.
            self.rejected = True
            logger.warning("the grammar refused sampled token %d; ending the request", token_id)
        else:
            # The engine gave up on the grammar (a parser's limit) or nothing could follow: an error
            # for the client, never an empty or cut-off answer passed off as finished.
            kind = KIND_NAMES[self.params.kind]
            self.error = GrammarCompileError(
                self.field, f"{self.field}: the grammar engine could not follow the {kind}: {reason}"
            )
            logger.warning("the grammar engine gave up on a request: %s", reason)
        return False

    def _watch_thinking(self, token_id: int) -> None:
        self._recent = (self._recent + [token_id])[-len(self.reasoning_end) :]
        if self._recent == self.reasoning_end:
            self.thinking = False

    def is_terminated(self) -> bool:
        """The request must end now: its grammar is complete and the model has said so with a stop
        token (llguidance completes on the last character, and then allows only stop tokens; that
        stop token, not the grammar's last character, is what the detokenizer leaves out), or it
        sampled a token the grammar refused."""
        if self.matcher is None or self.thinking:
            return False
        return self.rejected or (self.matcher.is_terminated() and self.last_token in self.backend.stop_token_ids)

    def __repr__(self) -> str:
        state: Any = "ready" if self.matcher is not None else "compiling"
        return f"StructuredOutputRequest({self.params.kind}, {state})"
