"""Prometheus metrics (names mirror vLLM's, prefixed `tram:`) and the periodic throughput log line."""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tram.config.server_args import DEFAULT_LOG_INTERVAL
from tram.engine.messages import SchedulerStats, SpecDecodingCounts
from tram.engine.stats import IterationStats

logger = logging.getLogger("tram.metrics")

# Seconds: fine below 0.1 (per-token latencies), coarse past it (whole requests).
_LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0]
_LATENCY_BUCKETS += [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0]
_COMPILE_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_ITL_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
FINISH_REASONS = ("stop", "length", "abort")


class PrometheusStatLogger:
    """One engine core's metrics. Owns its registry, so several engines (tests) can live in one
    process; the replicas of a data-parallel server share one (`for_engines`), each labelled
    `engine="i"` as vLLM labels them."""

    def __init__(
        self,
        model_name: str,
        registry: CollectorRegistry | None = None,
        engine: str | None = None,
        families: dict[str, Any] | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        families = {} if families is None else families
        labels = ["model_name"] + ([] if engine is None else ["engine"])
        values = [model_name] + ([] if engine is None else [engine])

        def family(kind: Any, name: str, doc: str, extra: tuple[str, ...] = (), **kw: Any) -> Any:
            if name not in families:  # a family is registered once, whatever the number of engines
                families[name] = kind(f"tram:{name}", doc, labels + list(extra), registry=self.registry, **kw)
            return families[name]

        def gauge(name: str, doc: str) -> Gauge:
            return family(Gauge, name, doc).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return family(Counter, name, doc).labels(*values)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return family(Histogram, name, doc, buckets=buckets).labels(*values)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Requests preempted (recomputed later).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        success = family(Counter, "request_success", "Finished requests by finish reason.", ("finished_reason",))
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Arrival to first scheduled.", _LATENCY_BUCKETS)
        self.structured = counter("structured_output_requests", "Requests whose output a grammar constrains.")
        self.compile_time = histogram(
            "grammar_compile_seconds", "Time to compile a structured-output grammar.", _COMPILE_BUCKETS
        )
        self.compile_failures = counter(
            "grammar_compile_failures", "Grammars that failed to compile or timed out (each fails its request)."
        )
        self.grammar_hits = counter("grammar_cache_hits", "Constrained requests whose grammar was already compiled.")
        self.spec_drafts = counter("spec_decode_num_drafts", "Draft runs verified (one per request and step).")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        per_pos = family(
            Counter,
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each position of the draft.",
            ("position",),
        )
        self.spec_per_pos = lambda pos: per_pos.labels(*values, str(pos))
        self._last = SchedulerStats()

    @classmethod
    def for_engines(cls, model_name: str, num_engines: int) -> list[PrometheusStatLogger]:
        """One logger per engine core over one registry: unlabelled with one engine, `engine="i"` past it."""
        if num_engines == 1:
            return [cls(model_name)]
        registry, families = CollectorRegistry(), {}
        return [cls(model_name, registry, str(i), families) for i in range(num_engines)]

    def record(self, sched: SchedulerStats | None, it: IterationStats | None) -> None:
        if sched is not None:
            self.running.set(sched.num_running_reqs)
            self.waiting.set(sched.num_waiting_reqs)
            self.kv_usage.set(sched.kv_cache_usage)
            # The core reports running totals; counters take the increments.
            self.prefix_queries.inc(max(0, sched.prefix_cache_queries - self._last.prefix_cache_queries))
            self.prefix_hits.inc(max(0, sched.prefix_cache_hits - self._last.prefix_cache_hits))
            self.preemptions.inc(max(0, sched.num_preemptions - self._last.num_preemptions))
            self._record_structured(sched)
            self._record_spec_decoding(sched)
            self._last = sched
        if it is None:
            return
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        for v in it.time_to_first_tokens:
            self.ttft.observe(v)
        for v in it.inter_token_latencies:
            self.itl.observe(v)
        for v in it.queue_times:
            self.queue.observe(v)
        for f in it.finished_requests:
            self.success.get(f.finish_reason, self.success["abort"]).inc()
            self.e2e.observe(f.e2e_latency)

    def _record_spec_decoding(self, sched: SchedulerStats) -> None:
        now, last = sched.spec_decoding, self._last.spec_decoding or SpecDecodingCounts()
        if now is None:
            return
        self.spec_drafts.inc(max(0, now.num_drafts - last.num_drafts))
        self.spec_draft_tokens.inc(max(0, now.num_draft_tokens - last.num_draft_tokens))
        self.spec_accepted.inc(max(0, now.num_accepted_tokens - last.num_accepted_tokens))
        for pos, count in enumerate(now.accepted_per_pos):
            before = last.accepted_per_pos[pos] if pos < len(last.accepted_per_pos) else 0
            self.spec_per_pos(pos).inc(max(0, count - before))

    def _record_structured(self, sched: SchedulerStats) -> None:
        last = self._last
        self.structured.inc(max(0, sched.structured_output_requests - last.structured_output_requests))
        self.compile_failures.inc(max(0, sched.grammar_compile_failures - last.grammar_compile_failures))
        self.grammar_hits.inc(max(0, sched.grammar_cache_hits - last.grammar_cache_hits))
        for seconds in sched.grammar_compile_seconds:
            self.compile_time.observe(seconds)


class LoggingStatLogger:
    """A log line every `interval` seconds while there is work: throughput, queue, KV and cache use."""

    def __init__(self, interval: float = DEFAULT_LOG_INTERVAL) -> None:
        self.interval = interval
        self.last_log = time.monotonic()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.sched = SchedulerStats()
        self._hits_at_log = (0, 0)
        self._spec_at_log = SpecDecodingCounts()

    def record(self, sched: SchedulerStats | None, it: IterationStats | None) -> None:
        if sched is not None:
            self.sched = sched
        if it is not None:
            self.prompt_tokens += it.num_prompt_tokens
            self.generation_tokens += it.num_generation_tokens

    def maybe_log(self) -> None:
        now = time.monotonic()
        elapsed = now - self.last_log
        if elapsed < self.interval:
            return
        s = self.sched
        busy = self.prompt_tokens or self.generation_tokens or s.num_running_reqs or s.num_waiting_reqs
        if busy:
            queries = s.prefix_cache_queries - self._hits_at_log[0]
            hits = s.prefix_cache_hits - self._hits_at_log[1]
            logger.info(
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                self.prompt_tokens / elapsed,
                self.generation_tokens / elapsed,
                s.num_running_reqs,
                s.num_waiting_reqs,
                100 * s.kv_cache_usage,
                100 * hits / queries if queries else 0.0,
            )
            self._log_spec_decoding(s.spec_decoding)
        self.last_log = now
        self.prompt_tokens = self.generation_tokens = 0
        self._hits_at_log = (s.prefix_cache_queries, s.prefix_cache_hits)

    def _log_spec_decoding(self, now: SpecDecodingCounts | None) -> None:
        """vLLM's speculative decoding line, over the drafts since the last log."""
        if now is None:
            return
        last = self._spec_at_log
        self._spec_at_log = now
        since = SpecDecodingCounts(
            now.num_drafts - last.num_drafts,
            now.num_draft_tokens - last.num_draft_tokens,
            now.num_accepted_tokens - last.num_accepted_tokens,
        )
        if since.num_drafts <= 0:
            return
        per_pos = [
            (count - (last.accepted_per_pos[i] if i < len(last.accepted_per_pos) else 0)) / since.num_drafts
            for i, count in enumerate(now.accepted_per_pos)
        ]
        logger.info(
            "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted: %d tokens, Drafted: %d tokens, "
            "Acceptance rate: %.1f%%, Per-position acceptance rate: %s",
            since.mean_acceptance_length,
            since.num_accepted_tokens,
            since.num_draft_tokens,
            100 * since.acceptance_rate,
            ", ".join(f"{r:.3f}" for r in per_pos),
        )
