"""A request as the core sees it: token ids, how many of them have KV computed, and when to stop."""

from __future__ import annotations

import enum
import time
from typing import Protocol

from tram.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class GrammarState(Protocol):
    """A constrained request's grammar (tram/structured_output/request.py), as the scheduler
    (is_ready, is_terminated) and the structured-output manager (accept_token) see it."""

    def is_ready(self) -> bool: ...

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...


class Request:
    """One sequence being generated.

    The scheduler's single idea: `num_tokens` (prompt + output so far) is what exists,
    `num_computed_tokens` is what has KV in the cache; each step closes part of the gap.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: list[int],
        max_model_len: int,
        arrival_time: float | None = None,
        prefix_source: Request | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # set when first scheduled
        self.scheduled_time: float | None = None  # wall clock, first time scheduled (queue time)
        self.num_preemptions = 0
        self.num_output_sent = 0  # output tokens the non-sampling pipeline stages have been sent
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.block_hashes: list[int] = []
        # Speculative decoding: the proposer's draft tokens for the next step (never in all_token_ids,
        # so never hashed into the prefix cache before they are verified).
        self.spec_token_ids: list[int] = []
        # A sibling (n > 1) whose prompt KV this request shares once it is computed.
        self.prefix_source = prefix_source
        # Set by the engine core for a structured-output request; it waits until the grammar is ready.
        self.structured_output: GrammarState | None = None
        p = sampling_params
        room = max_model_len - self.num_prompt_tokens
        self.max_tokens = max(1, room if p.max_tokens is None else min(p.max_tokens, max(room, 1)))
        self.max_model_len = max_model_len
        # As vLLM: the tokenizer's eos (first) stops with stop_reason None; the generation
        # config's other eos ids act as stop_token_ids and are reported as the stop_reason.
        self.eos_token_id: int | None = None
        stop_ids = set(p.stop_token_ids or ())
        if not p.ignore_eos and eos_token_ids:
            self.eos_token_id = eos_token_ids[0]
            stop_ids.update(eos_token_ids[1:])
        self.stop_token_ids = frozenset(stop_ids)
        # While min_tokens is unmet, every stop id and every eos id is masked, even with
        # ignore_eos (as vLLM does), so the sampler needs the full set.
        self.min_tokens_masked_ids = frozenset(p.stop_token_ids or ()) | frozenset(eos_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def max_drafts(self) -> int:
        """Draft tokens the next step may verify: those whose acceptance could still be kept, within
        max_tokens (the step's last token is always sampled) and the context."""
        return max(0, min(self.max_tokens - self.num_output_tokens - 1, self.max_model_len - self.num_tokens))

    def check_stop(self, grammar: bool = True) -> RequestStatus | None:
        """Stop on eos / stop_token_ids (after min_tokens), at the grammar's end (where `grammar`: the
        grammar's state is this token's), or on length; None to keep going."""
        n_out = len(self.output_token_ids)
        if grammar and self.structured_output is not None and self.structured_output.is_terminated():
            return RequestStatus.FINISHED_STOPPED
        if n_out >= self.sampling_params.min_tokens:
            last = self.output_token_ids[-1]
            if last == self.eos_token_id:
                return RequestStatus.FINISHED_STOPPED
            if last in self.stop_token_ids:
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if n_out >= self.max_tokens or self.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
