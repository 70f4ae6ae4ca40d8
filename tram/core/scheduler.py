"""Iteration-level scheduler: every step, hand out a token budget so computed counts catch up.

Running requests go first (in admission order), then waiting ones in arrival order. A prompt
longer than the remaining budget is chunked across steps, so decodes never starve. When the KV
cache runs out, the newest running request is preempted by recompute: its blocks are freed and
it goes back to the front of the waiting queue with its output kept.

Speculative decoding adds lookahead: a decoding request with drafts (from the worker's proposer)
is scheduled its last token plus the drafts, and its computed count moves back over the drafts the
step rejected. Drafts never enter `all_token_ids`, so the prefix cache only ever hashes verified
tokens.
"""

from __future__ import annotations

import time
from collections import deque

from tram.config import CacheConfig, SchedulerConfig
from tram.core.kv_cache_manager import GroupBlocks, KVCacheManager
from tram.core.outputs import EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from tram.core.request import Request, RequestStatus
from tram.core.sched_output import (
    CachedRequestData,
    LogprobsLists,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from tram.core.spec_stats import SpecDecodingStats


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, send_token_ids: bool = False
    ) -> None:
        self.config = scheduler_config
        # Under pipeline parallelism only the last stage samples: the others learn each request's new
        # output tokens from its next CachedRequestData.
        self.send_token_ids = send_token_ids
        self.block_size = cache_config.block_size
        self.kv_cache_manager = KVCacheManager(
            cache_config.num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            cache_config.group_windows,
        )
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Ids finished since the last schedule(): the worker drops their state.
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        # Requests in a step whose output has not come back (pipeline parallelism keeps several
        # steps in flight): they sit out later steps until it does, and are never preempted.
        self.in_flight: set[str] = set()
        self.spec_stats = SpecDecodingStats()

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """End requests from outside the step (abort, stop string); unknown ids are ignored."""
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.status.is_finished:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._free(req, status)
            done.append(req)
        return done

    def _free(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        req.prefix_source = None
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]
        self.finished_req_ids.add(req.request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        budget = self.config.max_num_batched_tokens
        budget, preempted = self._schedule_running(out, budget)
        if not preempted:
            self._schedule_waiting(out, budget)
        for rid, n in out.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n
        self.in_flight.update(out.num_scheduled_tokens)
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> tuple[int, bool]:
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.request_id in self.in_flight:
                i += 1
                continue
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            assert num_new > 0, f"running request with nothing to compute: {req}"
            drafts = self._drafts(req, num_new, budget)
            num_new += len(drafts)
            new_blocks = self._allocate(req, num_new)
            while new_blocks is None:
                victim = self._pick_victim(i)  # newest first; never one already scheduled or in flight
                if victim is None:
                    break
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
                new_blocks = self._allocate(req, num_new)
            if new_blocks is None:
                break
            out.scheduled_cached_reqs.append(
                self._cached(req, [[b.block_id for b in g] for g in new_blocks], req.num_computed_tokens)
            )
            out.num_scheduled_tokens[req.request_id] = num_new
            if drafts:
                out.scheduled_spec_decode_tokens[req.request_id] = drafts
            budget -= num_new
            i += 1
        return budget, preempted

    def _allocate(self, req: Request, num_new: int, computed_blocks: GroupBlocks | None = None) -> GroupBlocks | None:
        """Blocks for the step's tokens, and for a draft model's lookahead where the step samples
        (never past the context)."""
        end = req.num_computed_tokens + num_new + (len(computed_blocks[0]) * self.block_size if computed_blocks else 0)
        lookahead = 0
        if self.config.num_lookahead_tokens and end >= req.num_tokens:
            lookahead = max(0, min(self.config.num_lookahead_tokens, self.config.max_model_len - end))
        return self.kv_cache_manager.allocate_slots(req, num_new, computed_blocks, lookahead)

    @staticmethod
    def _drafts(req: Request, num_new: int, budget: int) -> list[int]:
        """The drafts a decoding request verifies this step (used up either way: the next step's
        come from this step's output)."""
        drafts, req.spec_token_ids = req.spec_token_ids, []
        if not drafts or num_new != 1 or req.num_tokens - req.num_computed_tokens != 1:
            return []
        return drafts[: min(budget - 1, req.max_drafts())]

    def _cached(
        self, req: Request, block_ids: list[list[int]], num_computed: int, resumed: bool = False
    ) -> CachedRequestData:
        data = CachedRequestData(req.request_id, block_ids, num_computed, resumed)
        if self.send_token_ids and req.num_output_sent < len(req.output_token_ids):
            data.new_token_ids = req.output_token_ids[req.num_output_sent :]
            req.num_output_sent = len(req.output_token_ids)
        return data

    def _pick_victim(self, current: int) -> Request | None:
        """The newest running request from `current` on that is not in flight (removed from running)."""
        for j in range(len(self.running) - 1, current - 1, -1):
            if self.running[j].request_id not in self.in_flight:
                return self.running.pop(j)
        return None

    def _preempt(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if self._waits_for_sibling(req) or not self._grammar_ready(req):
                deferred.append(self.waiting.popleft())
                continue
            computed_blocks, num_hit = self._find_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, budget)
            new_blocks = self._allocate(req, num_new, computed_blocks)
            if new_blocks is None:
                break
            self.waiting.popleft()
            resumed = req.status == RequestStatus.PREEMPTED
            req.status = RequestStatus.RUNNING
            req.prefix_source = None
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
                req.scheduled_time = time.time()
            self.running.append(req)
            block_ids = self.kv_cache_manager.get_block_ids(req.request_id)
            if resumed:
                out.scheduled_cached_reqs.append(self._cached(req, block_ids, num_hit, True))
            else:
                out.scheduled_new_reqs.append(
                    NewRequestData(
                        req.request_id,
                        req.prompt_token_ids,
                        req.sampling_params,
                        block_ids,
                        num_hit,
                        req.min_tokens_masked_ids,
                    )
                )
            out.num_scheduled_tokens[req.request_id] = num_new
            budget -= num_new
        self.waiting.extendleft(reversed(deferred))

    def _waits_for_sibling(self, req: Request) -> bool:
        """An n > 1 sample waits until its sibling has computed the shared prompt."""
        src = req.prefix_source
        if src is None:
            return False
        if src.status == RequestStatus.RUNNING and src.num_computed_tokens < src.num_prompt_tokens:
            return True
        if src.status != RequestStatus.RUNNING:
            req.prefix_source = None  # sibling gone or preempted: fall back to the prefix cache
        return False

    @staticmethod
    def _grammar_ready(req: Request) -> bool:
        """A structured-output request starts once its grammar is compiled (off the step loop)."""
        return req.structured_output is None or req.structured_output.is_ready()

    def _find_computed_blocks(self, req: Request):
        if req.prefix_source is not None:
            return self.kv_cache_manager.get_shared_prefix_blocks(req, req.prefix_source)
        return self.kv_cache_manager.get_computed_blocks(req)

    # ---- after the step -------------------------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> EngineCoreOutputs:
        outputs: list[EngineCoreOutput] = []
        self.in_flight.difference_update(sched.num_scheduled_tokens)
        for rid in sched.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None:  # finished from outside while the step ran
                continue
            tokens = result.sampled_token_ids.get(rid)
            prompt_lp = result.prompt_logprobs.get(rid)
            if not tokens:
                if prompt_lp is not None:
                    outputs.append(EngineCoreOutput(rid, [], new_prompt_logprobs=prompt_lp))
                continue
            drafts = sched.scheduled_spec_decode_tokens.get(rid)
            if drafts:  # the rejected drafts' KV is left to be overwritten
                req.num_computed_tokens -= len(drafts) + 1 - len(tokens)
                self.spec_stats.observe(len(drafts), len(tokens) - 1)
            status, kept = self._append_tokens(req, tokens)
            out = EngineCoreOutput(
                rid,
                tokens[:kept],
                new_logprobs=_first_rows(result.logprobs.get(rid), kept),
                new_prompt_logprobs=prompt_lp,
                num_cached_tokens=max(req.num_cached_tokens, 0),
            )
            if req.num_output_tokens == kept and req.scheduled_time is not None:
                out.queue_time = max(0.0, req.scheduled_time - req.arrival_time)
            if status is not None:
                self.running.remove(req)
                self._free(req, status)
                out.finish_reason = status.finish_reason
                out.stop_reason = req.stop_reason
            else:
                req.spec_token_ids = result.spec_token_ids.get(rid, [])
            outputs.append(out)
        return EngineCoreOutputs(outputs, self.make_stats(sched.total_num_scheduled_tokens))

    @staticmethod
    def _append_tokens(req: Request, tokens: list[int]) -> tuple[RequestStatus | None, int]:
        """Append the step's tokens until one stops the request: (the stop, how many were kept)."""
        for i, token in enumerate(tokens):
            req.append_output_token(token)
            # The engine core has advanced a constrained request's grammar over all the step's tokens
            # (and cut them where it ended): its end is the last token's.
            status = req.check_stop(grammar=i == len(tokens) - 1)
            if status is not None:
                return status, i + 1
        return None, len(tokens)

    def make_stats(self, num_scheduled_tokens: int = 0) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage(),
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_scheduled_tokens=num_scheduled_tokens,
            spec_decoding=self.spec_stats.snapshot(),
        )


def _first_rows(lists: LogprobsLists | None, n: int) -> LogprobsLists | None:
    """The logprobs of the first n tokens of a step's output (those a stop did not cut off)."""
    if lists is None or len(lists.token_ids) <= n:
        return lists
    return LogprobsLists(lists.token_ids[:n], lists.logprobs[:n], lists.ranks[:n])
