"""The engine core: schedule -> execute -> update, over token ids only.

It runs in-process under the offline `LLM` and, for the server, in its own process behind ZMQ;
that is why its inputs and outputs are msgspec structs.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from tram.config import EngineConfig
from tram.core.kv_cache_groups import blocks_per_request
from tram.core.request import Request, RequestStatus
from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput
from tram.core.scheduler import Scheduler
from tram.engine.messages import EngineCoreOutputs, EngineCoreRequest, RequestError, SchedulerStats
from tram.engine.structured_outputs import (
    GRAMMAR_POLL_S,
    add_structured_output_stats,
    make_structured_output_manager,
)
from tram.executor import Executor, make_executor
from tram.sampling_params import SamplingParamError
from tram.worker.kv_cache import describe_layout, kv_cache_layout
from tram.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        config.model_config.resolve()
        cc, sc = config.cache_config, config.scheduler_config
        self.executor: Executor = make_executor(config)
        try:
            self._initialize_kv_cache()
        except BaseException:
            self.executor.shutdown()
            raise
        # Only the last pipeline stage samples: the scheduler sends the others each request's new tokens.
        pp = config.parallel_config.pipeline_parallel_size
        self.scheduler = Scheduler(sc, cc, send_token_ids=pp > 1)
        # Steps submitted and not yet collected, oldest first; up to one per pipeline stage. Only
        # step_with_batch_queue fills it.
        self.batch_queue: deque[tuple[SchedulerOutput, Callable[[], ModelRunnerOutput]]] = deque()
        self.batch_queue_size = pp
        self.structured_output = make_structured_output_manager(config)
        # What the engine loop calls each step, chosen once here: with pipeline stages, a step is
        # submitted while earlier ones still run, so the stages work on different steps at once.
        self.step_fn: Callable[[], EngineCoreOutputs] = self.step_with_batch_queue if pp > 1 else self.step

    @property
    def model_runner(self) -> ModelRunner:
        """The model runner of a one-rank (`uni`) engine, for tests and benchmarks that inspect it."""
        return self.executor.model_runner  # type: ignore[attr-defined]

    def _initialize_kv_cache(self) -> None:
        config = self.config
        cc, sc = config.cache_config, config.scheduler_config
        layout = kv_cache_layout(config)
        cc.group_windows = layout.group_windows
        cc.num_blocks = self.executor.determine_num_blocks()
        usable = cc.num_blocks - any(w is not None for w in layout.group_windows)  # less the null block
        per_request = blocks_per_request(
            layout.group_windows, sc.max_model_len, cc.block_size, sc.max_num_batched_tokens
        )
        if usable < per_request:
            raise ValueError(
                f"The KV cache holds {cc.num_blocks} blocks of {cc.block_size} tokens; one request of "
                f"max_model_len={sc.max_model_len} tokens needs {per_request}. Lower max_model_len or give "
                "the cache more room (num_gpu_blocks_override, kv_cache_memory_bytes or gpu_memory_utilization)."
            )
        self.executor.initialize_kv_cache(cc.num_blocks)
        kv_dtype = config.model_config.dtype if cc.cache_dtype == "auto" else cc.cache_dtype
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB per rank, %s), %s; maximum concurrency at %d tokens "
            "per request: %.2fx",
            cc.num_blocks,
            cc.block_size,
            cc.num_blocks * self.executor.bytes_per_block() / 2**20,
            kv_dtype,
            describe_layout(layout),
            sc.max_model_len,
            usable / per_request,
        )

    def add_request(self, req: EngineCoreRequest) -> None:
        source = None
        if req.prefix_source_id is not None:
            source = self.scheduler.requests.get(req.prefix_source_id)
        request = Request(
            req.request_id,
            req.prompt_token_ids,
            req.sampling_params,
            req.eos_token_ids,
            self.config.scheduler_config.max_model_len,
            req.arrival_time,
            source,
        )
        if req.sampling_params.structured_outputs is not None:
            if self.structured_output is None:
                raise SamplingParamError(
                    "structured_outputs",
                    "structured outputs need the tokenizer (the engine was started with skip_tokenizer_init)",
                )
            so = self.structured_output.new_request(request.request_id, req.sampling_params.structured_outputs)
            request.structured_output = so
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        self.scheduler.finish_requests(request_ids, status)
        if self.structured_output is not None:
            # Now, not at the next step: an idle engine takes none, and the compile should stop.
            self.structured_output.forget(request_ids)

    def step(self) -> EngineCoreOutputs:
        """One step: schedule, execute, update."""
        sched, errors = self._schedule()
        result = self.executor.execute_model(sched)
        return self._update(sched, result, errors)

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """One step under pipeline parallelism: submit the scheduled step and return at once while
        fewer than batch_queue_size steps are in flight, else collect and update the oldest. An empty
        schedule is run, as in `step`, only when nothing is in flight; else it waits for the oldest."""
        sched, errors = self._schedule()
        if not sched.is_empty or not self.batch_queue:
            self.batch_queue.append((sched, self.executor.submit_model(sched)))
        if not sched.is_empty and len(self.batch_queue) < self.batch_queue_size:
            stats = self.scheduler.make_stats(sched.total_num_scheduled_tokens)
            return self._with_errors_and_stats(EngineCoreOutputs([], stats), errors)
        done, collect = self.batch_queue.popleft()
        return self._update(done, collect(), errors)

    def _schedule(self) -> tuple[SchedulerOutput, list[RequestError]]:
        """The scheduler's output with its grammar bitmask, and the requests whose grammar failed."""
        self.executor.raise_if_failed()
        errors = self._fail_grammars()
        sched = self.scheduler.schedule()
        so = self.structured_output
        if so is not None:
            so.fill_bitmask(sched, self.scheduler.requests)
            if sched.is_empty and not errors and not self.batch_queue:
                so.wait_for_compiles(GRAMMAR_POLL_S)  # nothing to run yet: sleep, do not spin
        return sched, errors

    def _update(
        self, sched: SchedulerOutput, result: ModelRunnerOutput, errors: list[RequestError]
    ) -> EngineCoreOutputs:
        """The sampled tokens into the grammars, then into the requests (whose stop check reads the
        grammar); the drafts for the next step cut to what the grammars accept."""
        if self.structured_output is not None:
            broken = self.structured_output.advance(sched, result, self.scheduler.requests)
            if broken:  # a grammar the engine gave up on fails its request (the update skips it)
                self.scheduler.finish_requests([rid for rid, _ in broken], RequestStatus.FINISHED_ABORTED)
                errors = errors + [RequestError(rid, str(e), e.param, client_error=True) for rid, e in broken]
        outputs = self.scheduler.update_from_output(sched, result)
        if self.structured_output is not None and result.spec_token_ids:
            self.structured_output.trim_drafts(self.scheduler.requests)
        return self._with_errors_and_stats(outputs, errors)

    def _with_errors_and_stats(self, outputs: EngineCoreOutputs, errors: list[RequestError]) -> EngineCoreOutputs:
        outputs.request_errors = errors
        if self.structured_output is not None and outputs.scheduler_stats is not None:
            add_structured_output_stats(outputs.scheduler_stats, self.structured_output)
        return outputs

    def _fail_grammars(self) -> list[RequestError]:
        """Requests whose grammar failed to compile (or timed out) end here, before scheduling."""
        if self.structured_output is None or not self.structured_output.pending:
            return []
        failures = self.structured_output.take_failures(self.scheduler.requests)
        self.scheduler.finish_requests([rid for rid, _ in failures], RequestStatus.FINISHED_ABORTED)
        return [RequestError(rid, str(e), e.param, client_error=True) for rid, e in failures]

    def wait_for_grammars(self, request_ids: list[str]) -> None:
        """Offline submission: raise the grammar error of these requests now (ValueError)."""
        if self.structured_output is not None:
            error = self.structured_output.wait_compiled(request_ids)
            if error is not None:
                self.abort_requests(request_ids)
                raise error

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_stats(self) -> SchedulerStats:
        stats = self.scheduler.make_stats()
        if self.structured_output is not None:
            add_structured_output_stats(stats, self.structured_output, take_compile_times=False)
        return stats

    def shutdown(self) -> None:
        if self.structured_output is not None:
            self.structured_output.shutdown()
        self.executor.shutdown()

    def check_kv_integrity(self) -> dict[str, int]:
        return self.scheduler.kv_cache_manager.check_integrity()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv_cache_manager.reset_prefix_cache()
