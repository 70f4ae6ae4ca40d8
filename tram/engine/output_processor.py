"""Turns the core's token-id outputs into `RequestOutput`s: detokenizes incrementally, matches stop
strings, formats logprobs and gathers the n samples of a request."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tram.engine.messages import EngineCoreOutput, LogprobsLists
from tram.engine.detokenizer import IncrementalDetokenizer, decode_token
from tram.engine.stats import FinishedRequestStats, IterationStats
from tram.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput
from tram.sampling_params import SamplingParams


@dataclass
class SampleState:
    """One of the n samples of a request (a child request in the core)."""

    index: int
    detokenizer: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def text(self) -> str:
        # Unfinished text withholds a possible stop-string prefix, so streamed text never shrinks.
        if self.detokenizer is None:
            return ""
        return self.detokenizer.get_next_output_text(self.finish_reason is not None, delta=False)


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: dict[str, SampleState]
    final_only: bool
    metrics: RequestMetrics
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples.values())


class OutputProcessor:
    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}
        self.sample_owner: dict[str, str] = {}  # core (child) request id -> request id
        self.iteration_stats = IterationStats()  # since the last take_iteration_stats()

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        sample_ids: list[str], arrival_time: float, final_only: bool = False,
    ) -> None:
        samples = {}
        for i, sid in enumerate(sample_ids):
            samples[sid] = SampleState(i, self._make_detokenizer(prompt_token_ids, params))
            if params.logprobs is not None:
                samples[sid].logprobs, samples[sid].cumulative_logprob = [], 0.0
            self.sample_owner[sid] = request_id
        state = RequestState(request_id, prompt, prompt_token_ids, params, samples, final_only,
                             RequestMetrics(arrival_time=arrival_time))
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.requests[request_id] = state

    def _make_detokenizer(self, prompt_token_ids: list[int], params: SamplingParams) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not params.detokenize:
            return None
        return IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens,
            stop=params.stop, include_stop_str_in_output=params.include_stop_str_in_output,
        )

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget requests; return the core request ids of their samples to abort there."""
        sample_ids: list[str] = []
        for rid in request_ids:
            state = self.requests.pop(rid, None)
            if state is None:
                continue
            state.metrics.finished_time = time.time()
            self._record_finished(state, "abort")
            for sid in state.samples:
                self.sample_owner.pop(sid, None)
                sample_ids.append(sid)
        return sample_ids

    def take_iteration_stats(self) -> IterationStats:
        """What happened since the last call (steps and aborts); the caller owns the result."""
        stats, self.iteration_stats = self.iteration_stats, IterationStats()
        return stats

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs; return the request outputs to emit and the core request ids
        that a stop string finished (the core must stop them)."""
        now = time.time()
        touched: dict[str, RequestState] = {}
        stopped_by_string: list[str] = []
        for out in outputs:
            rid = self.sample_owner.get(out.request_id)
            if rid is None:
                continue  # aborted by the caller meanwhile
            state = self.requests[rid]
            sample = state.samples[out.request_id]
            self._apply(state, sample, out, now)
            if sample.finish_reason is not None:
                self.sample_owner.pop(out.request_id, None)
                if out.finish_reason is None:
                    stopped_by_string.append(out.request_id)
            touched[rid] = state
        emitted = []
        for rid, state in touched.items():
            finished = state.finished
            if finished:
                state.metrics.finished_time = now
                del self.requests[rid]
                self._record_finished(state)
            if finished or not state.final_only:
                emitted.append(self._make_output(state, finished))
        return emitted, stopped_by_string

    def _apply(self, state: RequestState, sample: SampleState, out: EngineCoreOutput, now: float) -> None:
        if out.new_prompt_logprobs is not None and state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(self._logprob_dicts(out.new_prompt_logprobs))
        if not out.new_token_ids:
            return
        m, it = state.metrics, self.iteration_stats
        if m.first_token_time is None:
            m.first_token_time = now
            it.num_prompt_tokens += len(state.prompt_token_ids)
            it.time_to_first_tokens.append(now - m.arrival_time)
        else:
            it.inter_token_latencies.append(now - m.last_token_time)
        if out.queue_time is not None and state.queue_time is None:
            state.queue_time = out.queue_time
            it.queue_times.append(out.queue_time)
        m.last_token_time = now
        m.num_generation_tokens += len(out.new_token_ids)
        it.num_generation_tokens += len(out.new_token_ids)
        state.num_cached_tokens = out.num_cached_tokens
        sample.token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None and sample.logprobs is not None:
            sample.logprobs.extend(self._logprob_dicts(out.new_logprobs))
            sample.cumulative_logprob += sum(row[0] for row in out.new_logprobs.logprobs)
        matched = None
        if sample.detokenizer is not None:
            # The core only ever stops on token ids (eos or stop_token_ids).
            matched = sample.detokenizer.update(out.new_token_ids, out.finish_reason == "stop")
        if matched is not None and out.finish_reason != "stop":
            sample.finish_reason, sample.stop_reason = "stop", matched
        else:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason

    def _record_finished(self, state: RequestState, reason: str | None = None) -> None:
        m = state.metrics
        reasons = [s.finish_reason for s in state.samples.values()]
        # A request that ran out of room in any sample reports "length", like its worst sample.
        reason = reason or ("length" if "length" in reasons else reasons[0] or "abort")
        self.iteration_stats.finished_requests.append(FinishedRequestStats(
            reason, (m.finished_time or m.arrival_time) - m.arrival_time, state.queue_time,
            len(state.prompt_token_ids), m.num_generation_tokens,
        ))

    def _logprob_dicts(self, lp: LogprobsLists) -> list[dict[int, Logprob]]:
        rows = []
        for ids, vals, rank in zip(lp.token_ids, lp.logprobs, lp.ranks):
            # Column 0 is the chosen token; columns 1.. are the top-k with ranks 1..k.
            row = {tid: Logprob(v, r, self._decode(tid)) for r, (tid, v) in enumerate(zip(ids[1:], vals[1:]), 1)}
            row[ids[0]] = Logprob(vals[0], rank, self._decode(ids[0]))
            rows.append(row)
        return rows

    def _decode(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else decode_token(self.tokenizer, token_id)

    @staticmethod
    def _make_output(state: RequestState, finished: bool) -> RequestOutput:
        completions = [
            CompletionOutput(
                s.index, s.text, list(s.token_ids), s.cumulative_logprob,
                list(s.logprobs) if s.logprobs is not None else None, s.finish_reason, s.stop_reason,
            )
            for s in sorted(state.samples.values(), key=lambda s: s.index)
        ]
        return RequestOutput(
            state.request_id, state.prompt, state.prompt_token_ids, completions, finished,
            state.prompt_logprobs, state.num_cached_tokens, state.metrics,
        )
