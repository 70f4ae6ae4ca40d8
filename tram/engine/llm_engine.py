"""LLMEngine: the front end (tokenize, detokenize, gather samples) around the engine core."""
from __future__ import annotations

import logging
import time

from tram.core.outputs import SchedulerStats
from tram.core.request import RequestStatus
from tram.engine.arg_utils import EngineArgs, EngineConfig
from tram.engine.core import EngineCore, EngineCoreRequest
from tram.engine.input_processor import InputProcessor, PromptType
from tram.engine.output_processor import OutputProcessor
from tram.engine.tokenizer import get_stop_token_ids, load_tokenizer
from tram.outputs import RequestOutput
from tram.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """Drive it with `add_request` and `step`; requests join and leave between any two steps."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        mc = config.model_config
        self.tokenizer = None
        if not config.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(config.tokenizer, config.revision, config.trust_remote_code)
        self.eos_token_ids = self._eos_token_ids()
        self.engine_core = EngineCore(config)
        self.input_processor = InputProcessor(self.tokenizer, mc.vocab_size, mc.max_model_len, config.max_logprobs)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.last_stats: SchedulerStats = self.engine_core.get_stats()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls(engine_args.create_engine_config())

    def _eos_token_ids(self) -> list[int]:
        """The tokenizer's eos first (it stops with stop_reason None), then the others."""
        mc = self.config.model_config
        ids = get_stop_token_ids(mc.model, self.tokenizer, mc.hf_config)
        primary = getattr(self.tokenizer, "eos_token_id", None)
        if primary in ids:
            ids = [primary] + [i for i in ids if i != primary]
        return ids

    def get_tokenizer(self):
        return self.tokenizer

    def process_input(self, prompt: PromptType, params: SamplingParams) -> tuple[str | None, list[int]]:
        return self.input_processor.process(prompt, params)

    def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams,
        arrival_time: float | None = None, final_only: bool = False,
    ) -> None:
        """Validate, tokenize and queue a request; `n > 1` becomes n core requests sharing the prompt."""
        text, prompt_ids = self.process_input(prompt, params)
        self.add_processed_request(request_id, text, prompt_ids, params, arrival_time, final_only)

    def add_processed_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        arrival_time: float | None = None, final_only: bool = False,
    ) -> None:
        arrival = time.time() if arrival_time is None else arrival_time
        sample_ids = [request_id] if params.n == 1 else [f"{i}_{request_id}" for i in range(params.n)]
        # User ids and the core ids of n > 1 samples share one namespace: refuse any overlap.
        taken = self.output_processor.sample_owner
        if request_id in self.output_processor.requests or request_id in taken or any(s in taken for s in sample_ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        self.output_processor.add_request(
            request_id, prompt, prompt_token_ids, params, sample_ids, arrival, final_only
        )
        for i, sid in enumerate(sample_ids):
            child = params
            if params.n > 1:
                child = params.clone()
                child.n = 1
                if params.seed is not None:
                    child.seed = params.seed + i  # distinct yet reproducible samples
            self.engine_core.add_request(EngineCoreRequest(
                sid, prompt_token_ids, child, self.eos_token_ids, arrival,
                prefix_source_id=sample_ids[0] if i > 0 else None,
            ))

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.engine_core.abort_requests(self.output_processor.abort_requests(ids))

    def step(self) -> list[RequestOutput]:
        core_outputs = self.engine_core.step()
        if core_outputs.scheduler_stats is not None:
            self.last_stats = core_outputs.scheduler_stats
        outputs, stopped = self.output_processor.process_outputs(core_outputs.outputs)
        if stopped:
            self.engine_core.abort_requests(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests)

    def get_stats(self) -> SchedulerStats:
        """Running, waiting, KV usage, prefix-cache queries/hits (tokens), preemptions."""
        return self.engine_core.get_stats()

    def check_kv_integrity(self) -> dict[str, int]:
        return self.engine_core.check_kv_integrity()
