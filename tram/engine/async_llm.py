"""AsyncLLM: the server's engine. Text in, streams of `RequestOutput` out; the core runs in another process.

Each request gets an `OutputCollector` holding what its consumer has not taken yet. A cumulative
output replaces the one before it (a slow consumer skips intermediate states); DELTA outputs are
merged, so a slow consumer gets everything it missed in one output and nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec

from tram.config import EngineConfig
from tram.engine.core_client import EngineCoreClient, EngineDeadError
from tram.engine.dp_client import DPEngineCoreClient, combine_results
from tram.engine.frontend import EngineFrontend
from tram.engine.input_processor import OFFLINE_LENGTH_RULE, LengthRule, PromptType
from tram.engine.messages import EngineCoreOutputs, RequestError, SchedulerStats
from tram.engine.metrics import DEFAULT_LOG_INTERVAL, LoggingStatLogger, PrometheusStatLogger
from tram.engine.usage import OutputTokenCount, current_usage, log_request
from tram.outputs import RequestOutput, merge_deltas
from tram.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More requests are waiting than `max_queued_requests` allows."""


class RequestFailedError(RuntimeError):
    """The engine core could not run this request."""


class RequestRejectedError(ValueError):
    """The engine core refused this request as bad (an invalid or too costly grammar): a 400 naming
    `param`, though it was found after the request was submitted."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OutputCollector:
    """The outputs of one request between the engine (`put`, every step) and its consumer (`get`)."""

    def __init__(self, aggregate: bool = False) -> None:
        self.aggregate = aggregate  # DELTA outputs: merge them, never drop one
        self.pending: list[RequestOutput] = []
        self.error: BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput) -> None:
        if self.aggregate:
            self.pending.append(output)
        else:
            self.pending = [output]
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.ready.set()

    async def get(self) -> RequestOutput:
        await self.ready.wait()
        self.ready.clear()
        if self.error is not None:
            raise self.error
        outputs, self.pending = self.pending, []
        assert outputs
        return merge_deltas(outputs) if self.aggregate else outputs[0]


class RequestStream:
    """The outputs of one submitted request. Stopping early (aclose, or a cancelled `__anext__`)
    aborts the request in the engine, which frees its KV blocks on the next step."""

    def __init__(
        self, engine: AsyncLLM, request_id: str, collector: OutputCollector, tokens: OutputTokenCount | None = None
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.collector = collector
        self.tokens = tokens  # the submitting context's usage counter, if it keeps one
        self.done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.done:
            raise StopAsyncIteration
        try:
            out = await self.collector.get()
        except BaseException:
            self.close()
            raise
        self.done = out.finished
        if self.tokens is not None:
            self.tokens.add(out)
        return out

    async def started(self) -> None:
        """Wait for the first output without taking it; raise the request's error if it failed
        instead. A server awaits this before committing to a 200 when the engine core may still
        refuse the request (a grammar that does not compile)."""
        await self.collector.ready.wait()
        if self.collector.error is not None:
            self.close()
            raise self.collector.error

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.engine.abort(self.request_id)

    async def aclose(self) -> None:
        self.close()


class AsyncLLM(EngineFrontend):
    def __init__(
        self,
        config: EngineConfig,
        served_model_name: str | None = None,
        max_queued_requests: int | None = None,
        log_stats_interval: float = DEFAULT_LOG_INTERVAL,
        log_requests: bool = False,
        max_log_len: int | None = None,
    ) -> None:
        super().__init__(config)
        self.max_queued_requests = max_queued_requests
        self.log_requests = log_requests  # a line per request received (--enable-log-requests)
        self.max_log_len = max_log_len
        self.collectors: dict[str, OutputCollector] = {}
        self.last_stats = SchedulerStats()
        num_engines = config.parallel_config.data_parallel_size
        self.engine_stats = [SchedulerStats() for _ in range(num_engines)]
        self.prometheus_engines = PrometheusStatLogger.for_engines(
            served_model_name or config.model_config.model, num_engines
        )
        self.prometheus = self.prometheus_engines[0]  # its registry holds every engine's metrics
        self.log_stats = LoggingStatLogger(log_stats_interval)
        if num_engines > 1:
            self.core: EngineCoreClient | DPEngineCoreClient = DPEngineCoreClient(
                config, self._on_outputs, self._on_request_error, self._on_dead
            )
        else:
            self.core = EngineCoreClient(config, self._on_outputs, self._on_request_error, self._on_dead)
        self._log_task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.core.start()
        self.log_stats.last_log = time.monotonic()
        self._log_task = asyncio.create_task(self._log_loop())

    @property
    def is_running(self) -> bool:
        return self.core.is_alive

    @property
    def dead_reason(self) -> str | None:
        return self.core.dead_reason

    # ---- requests ---------------------------------------------------------------------------
    def _queue_over_limit(self, n: int) -> bool:
        """Would these n samples push the waiting queue over max_queued_requests?

        The core's waiting count is exact but only as fresh as its last message, so it is capped by
        what is still in flight; what this front end has in flight beyond max_num_seqs must wait
        whatever the core says. New samples wait behind anyone already waiting."""
        if self.max_queued_requests is None:
            return False
        in_flight = len(self.output_processor.sample_owner)
        waiting = min(self.last_stats.num_waiting_reqs, in_flight)
        after = max(waiting + (n if waiting else 0), in_flight + n - self.config.scheduler_config.max_num_seqs)
        return after > self.max_queued_requests

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
        length_rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> RequestStream:
        """Validate and submit a request now (ValueError, QueueFullError or EngineDeadError at once);
        iterate the returned stream for its outputs, of the kind `params.output_kind` asks for."""
        if not self.core.is_alive:
            raise EngineDeadError(self.core.dead_reason or "the engine is not running")
        text, prompt_ids = self.process_input(prompt, params, length_rule)
        if self._queue_over_limit(params.n):
            raise QueueFullError(
                f"The server is busy: the waiting queue would exceed {self.max_queued_requests} requests "
                "(--max-queued-requests). Retry later."
            )
        if self.log_requests:
            log_request(request_id, text, prompt_ids, params, self.max_log_len)
        core_requests = self.register_request(request_id, text, prompt_ids, params)
        collector = OutputCollector(aggregate=params.output_kind == RequestOutputKind.DELTA)
        self.collectors[request_id] = collector
        try:
            self.submit(request_id, core_requests, self.core.add_request, self.core.abort_requests)
        except BaseException:
            del self.collectors[request_id]
            raise
        usage = current_usage()
        if usage is None:
            return RequestStream(self, request_id, collector)
        usage.requests += 1
        usage.prompt_tokens += len(prompt_ids)
        return RequestStream(self, request_id, collector, OutputTokenCount(usage, collector.aggregate))

    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
    ) -> AsyncIterator[RequestOutput]:
        """Yield outputs (of the params' kind) until the request finishes. Closing the iterator early
        (a client that went away, a cancelled task) aborts the request in the engine."""
        stream = self.add_request(prompt, params, request_id)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()

    def abort(self, request_id: str) -> None:
        self.collectors.pop(request_id, None)
        sample_ids = self.output_processor.abort_requests([request_id])
        self.core.abort_requests(sample_ids)

    # ---- engine core callbacks (on the event loop) -------------------------------------------
    def _on_outputs(self, outputs: EngineCoreOutputs, engine: int = 0) -> None:
        if outputs.scheduler_stats is not None:
            self.engine_stats[engine] = outputs.scheduler_stats
            self.last_stats = (
                outputs.scheduler_stats
                if len(self.engine_stats) == 1
                else SchedulerStats(**combine_results([msgspec.structs.asdict(s) for s in self.engine_stats]))
            )
        for error in outputs.request_errors:
            self._on_request_error(error)
        request_outputs, stopped = self.output_processor.process_outputs(outputs.outputs)
        for out in request_outputs:
            collector = self.collectors.get(out.request_id)
            if collector is not None:
                collector.put(out)
                if out.finished:
                    del self.collectors[out.request_id]
        if stopped:
            self.core.abort_requests(stopped, stopped=True)
        it = self.output_processor.take_iteration_stats()
        self.prometheus_engines[engine].record(outputs.scheduler_stats, it)
        self.log_stats.record(self.last_stats if outputs.scheduler_stats is not None else None, it)

    def _on_request_error(self, error: RequestError) -> None:
        request_id = self.output_processor.sample_owner.get(error.request_id, error.request_id)
        collector = self.collectors.pop(request_id, None)
        self.abort(request_id)
        if collector is not None:
            failure = (
                RequestRejectedError(error.message, error.param)
                if error.client_error
                else RequestFailedError(error.message)
            )
            collector.fail(failure)

    def _on_dead(self, reason: str) -> None:
        error = EngineDeadError(reason)
        for collector in self.collectors.values():
            collector.fail(error)
        self.collectors.clear()
        self.output_processor.abort_requests(list(self.output_processor.requests))

    # ---- utilities ----------------------------------------------------------------------------
    async def get_stats(self) -> SchedulerStats:
        return SchedulerStats(**await self.core.call_utility("get_stats"))

    async def check_kv_integrity(self) -> dict[str, int]:
        return await self.core.call_utility("check_kv_integrity")

    async def reset_prefix_cache(self) -> bool:
        return await self.core.call_utility("reset_prefix_cache")

    async def _log_loop(self) -> None:
        while self.core.is_alive:
            await asyncio.sleep(1.0)
            self.log_stats.maybe_log()

    def shutdown(self) -> None:
        if self._log_task is not None:
            self._log_task.cancel()
        self.core.shutdown()
