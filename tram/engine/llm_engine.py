"""LLMEngine: the front end (tokenize, detokenize, gather samples) around the engine core."""

from __future__ import annotations

import logging

from tram.config import EngineArgs, EngineConfig
from tram.core.request import RequestStatus
from tram.engine.core import EngineCore
from tram.engine.engine_config import create_engine_config
from tram.engine.frontend import EngineFrontend
from tram.engine.input_processor import PromptType
from tram.engine.messages import RequestError, SchedulerStats
from tram.outputs import RequestOutput
from tram.sampling_params import SamplingParamError, SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine(EngineFrontend):
    """Drive it with `add_request` and `step`; requests join and leave between any two steps."""

    def __init__(self, config: EngineConfig) -> None:
        if config.parallel_config.data_parallel_size > 1:
            raise ValueError(
                "data_parallel_size > 1 runs several engine cores behind `tram serve`; offline, "
                "start one LLM per replica (or use tensor_parallel_size)"
            )
        super().__init__(config, log_stats=False)  # no metrics offline: nothing would read them
        self.engine_core = EngineCore(config)
        self.last_stats: SchedulerStats = self.engine_core.get_stats()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(create_engine_config(engine_args))

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """Validate, tokenize and queue a request; `n > 1` becomes n core requests sharing the prompt.
        `step` returns its outputs as `params.output_kind` asks (cumulative by default)."""
        text, prompt_ids = self.process_input(prompt, params)
        self.add_processed_request(request_id, text, prompt_ids, params, arrival_time)

    def add_processed_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        core_requests = self.register_request(request_id, prompt, prompt_token_ids, params, arrival_time)
        self.submit(request_id, core_requests, self.engine_core.add_request, self.engine_core.abort_requests)
        if params.structured_outputs is not None:
            # Offline, a bad schema is a ValueError here, as in vLLM, not an error in a later step.
            try:
                self.engine_core.wait_for_grammars([r.request_id for r in core_requests])
            except ValueError:
                self.output_processor.abort_requests([request_id])
                raise

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.engine_core.abort_requests(self.output_processor.abort_requests(ids))

    def step(self) -> list[RequestOutput]:
        core_outputs = self.engine_core.step_fn()
        if core_outputs.scheduler_stats is not None:
            self.last_stats = core_outputs.scheduler_stats
        outputs, stopped = self.output_processor.process_outputs(core_outputs.outputs)
        if stopped:
            self.engine_core.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if core_outputs.request_errors:
            self._raise_request_error(core_outputs.request_errors[0])
        return outputs

    def _raise_request_error(self, error: RequestError) -> None:
        """A request the engine core refused after submission (its grammar timed out): it ends,
        and the caller gets the ValueError."""
        owner = self.output_processor.sample_owner.get(error.request_id, error.request_id)
        self.engine_core.abort_requests(self.output_processor.abort_requests([owner]))
        raise SamplingParamError(error.param or "structured_outputs", f"request {owner}: {error.message}")

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests)

    def get_stats(self) -> SchedulerStats:
        """Running, waiting, KV usage, prefix-cache queries/hits (tokens), preemptions."""
        return self.engine_core.get_stats()

    def check_kv_integrity(self) -> dict[str, int]:
        return self.engine_core.check_kv_integrity()
