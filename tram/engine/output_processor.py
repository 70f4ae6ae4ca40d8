"""Turns the core's token-id outputs into `RequestOutput`s: detokenizes incrementally, matches stop
strings, formats logprobs and gathers the n samples of a request.

The core sends only what is new each step, and a step here costs O(new) for every request that
asked for DELTA or FINAL_ONLY outputs (see `request_state`), whatever it generated before.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.logprob_text import TokenTextTable, token_text_table
from tram.engine.messages import EngineCoreOutput, LogprobsLists
from tram.engine.request_state import RequestState, SampleState
from tram.engine.stats import FinishedRequestStats, IterationStats
from tram.outputs import Logprob, RequestMetrics, RequestOutput
from tram.sampling_params import SamplingParams


class OutputProcessor:
    def __init__(self, tokenizer: Any | None, log_stats: bool = True) -> None:
        self.tokenizer = tokenizer
        self.text_table: TokenTextTable | None = None if tokenizer is None else token_text_table(tokenizer)
        self.requests: dict[str, RequestState] = {}
        self.sample_owner: dict[str, str] = {}  # core (child) request id -> request id
        # What happened since the last take_iteration_stats(); None when nobody reads it.
        self.iteration_stats: IterationStats | None = IterationStats() if log_stats else None

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sample_ids: list[str],
        arrival_time: float,
    ) -> None:
        samples = {}
        for i, sid in enumerate(sample_ids):
            samples[sid] = SampleState(i, self._make_detokenizer(prompt_token_ids, params))
            if params.logprobs is not None:
                samples[sid].logprobs, samples[sid].cumulative_logprob = [], 0.0
            self.sample_owner[sid] = request_id
        state = RequestState(
            request_id, prompt, prompt_token_ids, params, samples, RequestMetrics(arrival_time=arrival_time)
        )
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]  # the first prompt token has no logprob
            self._decode_prompt(state)
        self.requests[request_id] = state

    def _make_detokenizer(self, prompt_token_ids: list[int], params: SamplingParams) -> IncrementalDetokenizer | None:
        if self.tokenizer is None or not params.detokenize:
            return None
        return IncrementalDetokenizer(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )

    def _decode_prompt(self, state: RequestState) -> None:
        # Decoded once, in context, so that prompt logprobs' tokens add up to the prompt's text as
        # the output's do to its text (O(prompt), like the prompt logprobs themselves).
        params = state.params
        if self.tokenizer is None or not params.detokenize:
            return
        detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            [],
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )
        detokenizer.update(state.prompt_token_ids, stop_terminated=False)
        state.prompt_texts, state.prompt_pending = detokenizer.last_texts, detokenizer.last_pending

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

    def take_iteration_stats(self) -> IterationStats | None:
        """What happened since the last call (steps and aborts); the caller owns the result."""
        stats = self.iteration_stats
        if stats is not None:
            self.iteration_stats = IterationStats()
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
            if sample.finished:
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
            request_output = state.make_output(finished)
            if request_output is not None:
                emitted.append(request_output)
        return emitted, stopped_by_string

    def _apply(self, state: RequestState, sample: SampleState, out: EngineCoreOutput, now: float) -> None:
        # Sample 0 computes the whole prompt (the worker sends each position once); its siblings
        # share its KV blocks and send only the part they compute, which adds nothing.
        if out.new_prompt_logprobs is not None and state.prompt_logprobs is not None and sample.index == 0:
            rows = self._logprob_dicts(
                out.new_prompt_logprobs, state.prompt_texts, state.prompt_pending, len(state.prompt_logprobs)
            )
            state.prompt_logprobs.extend(rows)
        if not out.new_token_ids:
            return
        state.num_cached_tokens = out.num_cached_tokens
        ids, logprobs = out.new_token_ids, out.new_logprobs
        matched, texts, pending = None, None, None
        if sample.detokenizer is not None:
            # The core only ever stops on token ids (eos or stop_token_ids).
            matched = sample.detokenizer.update(ids, out.finish_reason == "stop")
            texts, pending = sample.detokenizer.last_texts, sample.detokenizer.last_pending
            if matched is not None and sample.detokenizer.stop_ids_needed < len(ids):
                # Tokens of the same step after the stop string: one at a time, they would never have come.
                ids, texts, logprobs = _first(ids, texts, logprobs, sample.detokenizer.stop_ids_needed)
        self._record_token_times(state, len(ids), out.queue_time, now)
        sample.token_ids.extend(ids)
        if logprobs is not None and sample.logprobs is not None:
            sample.logprobs.extend(self._logprob_dicts(logprobs, texts, pending))
            sample.cumulative_logprob += sum(row[0] for row in logprobs.logprobs)
        if matched is not None and out.finish_reason != "stop":
            sample.finish_reason, sample.stop_reason = "stop", matched
        else:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        if sample.finish_reason is not None:
            state.num_finished += 1  # a finished sample gets no more outputs (sample_owner forgets it)
        sample.has_news = True

    def _record_token_times(self, state: RequestState, num_tokens: int, queue_time: float | None, now: float) -> None:
        m, it = state.metrics, self.iteration_stats
        first = m.first_token_time is None
        if it is not None:
            if first:
                it.num_prompt_tokens += len(state.prompt_token_ids)
                it.time_to_first_tokens.append(now - m.arrival_time)
                # Each sample's first token carries its queue time; the request's first is its own.
                if queue_time is not None:
                    it.queue_times.append(queue_time)
            else:
                it.inter_token_latencies.append(now - m.last_token_time)
            it.num_generation_tokens += num_tokens
        if first:
            m.first_token_time = now
        m.last_token_time = now
        m.num_generation_tokens += num_tokens

    def _record_finished(self, state: RequestState, reason: str | None = None) -> None:
        if self.iteration_stats is None:
            return
        m = state.metrics
        reasons = [s.finish_reason for s in state.samples.values()]
        # A request that ran out of room in any sample reports "length", like its worst sample.
        reason = reason or ("length" if "length" in reasons else reasons[0] or "abort")
        e2e = (m.finished_time or m.arrival_time) - m.arrival_time
        self.iteration_stats.finished_requests.append(FinishedRequestStats(reason, e2e))

    def _logprob_dicts(
        self,
        lp: LogprobsLists,
        texts: list[str] | None,
        pending: dict[int, list[int]] | None,
        start: int = 0,
    ) -> list[dict[int, Logprob]]:
        """One dict per position. From position `start`, `texts` holds what each chosen token added
        and `pending` the ids held (an unfinished character) before some, which alternatives may
        complete. Without a detokenizer (detokenize=False) the chosen token's text is its text
        alone, like an alternative's (see `logprob_text`)."""
        table = self.text_table
        rows = []
        for i, (ids, vals, rank) in enumerate(zip(lp.token_ids, lp.logprobs, lp.ranks)):
            # Column 0 is the chosen token; columns 1.. are the top-k with ranks 1..k.
            if table is None:
                row = {tid: Logprob(v, r) for r, (tid, v) in enumerate(zip(ids[1:], vals[1:]), 1)}
                row[ids[0]] = Logprob(vals[0], rank)
            else:
                held = pending.get(start + i) if pending else None
                alt = table.alternative if held is None else functools.partial(table.alternative_after, held)
                row = {tid: Logprob(v, r, alt(tid)) for r, (tid, v) in enumerate(zip(ids[1:], vals[1:]), 1)}
                chosen = texts[start + i] if texts is not None else table.alternative(ids[0])
                row[ids[0]] = Logprob(vals[0], rank, chosen)
            rows.append(row)
        return rows


def _first(
    ids: list[int], texts: list[str], logprobs: LogprobsLists | None, n: int
) -> tuple[list[int], list[str], LogprobsLists | None]:
    """The first n tokens of a step's output, with their texts and logprobs rows."""
    if logprobs is not None:
        logprobs = LogprobsLists(logprobs.token_ids[:n], logprobs.logprobs[:n], logprobs.ranks[:n])
    return ids[:n], texts[:n], logprobs
