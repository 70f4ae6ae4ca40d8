"""The front end shared by the offline `LLMEngine` and the server's `AsyncLLM`.

It owns everything on the text side of the engine core: the tokenizer, input validation, the output
processor (detokenizing, stop strings, gathering the n samples) and the fan-out of one request into
the core requests of its samples. The two engines differ only in how they reach the core: a direct
call, or a message over ZMQ to another process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from tram.config import EngineConfig
from tram.engine.input_processor import OFFLINE_LENGTH_RULE, InputProcessor, LengthRule, PromptType
from tram.engine.messages import EngineCoreRequest
from tram.engine.output_processor import OutputProcessor
from tram.engine.tokenizer import check_tokenizer_fits, get_stop_token_ids, load_tokenizer
from tram.sampling_params import SamplingParams
from tram.sampling_params.structured import CHECKED_UPSTREAM


def schema_as_text(params: SamplingParams) -> SamplingParams:
    """`params` with a JSON schema given as nested values turned into its JSON text (keys sorted, so
    equal schemas share a grammar): one string crosses to the engine core, where a 400 KB schema
    decoded as nested values took its step loop ~20-100 ms, and is copied for n > 1 for nothing.
    msgspec writes it in ~1 ms where json.dumps took ~20 ms of the server's event loop."""
    so = params.structured_outputs
    if so is None or not isinstance(so.json, dict):
        return params
    token = CHECKED_UPSTREAM.set(True)  # checked when it was built: not parsed and walked again
    try:
        text = msgspec.structs.replace(so, json=msgspec.json.encode(so.json, order="sorted").decode())
        return msgspec.structs.replace(params, structured_outputs=text)
    finally:
        CHECKED_UPSTREAM.reset(token)


def sample_request_ids(request_id: str, n: int) -> list[str]:
    """Core request ids of the n samples of a request (vLLM's naming for parallel sampling)."""
    return [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]


class EngineFrontend:
    def __init__(self, config: EngineConfig, log_stats: bool = True) -> None:
        self.config = config
        mc = config.model_config
        self.tokenizer: Any | None = None
        if not config.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(config.tokenizer, config.revision, config.trust_remote_code)
            check_tokenizer_fits(self.tokenizer, mc.vocab_size, config.tokenizer)
        self.eos_token_ids = self._eos_token_ids()
        self.input_processor = InputProcessor(
            self.tokenizer, mc.vocab_size, mc.max_model_len, config.max_logprobs, config.scheduler_config.max_num_seqs
        )
        self.output_processor = OutputProcessor(self.tokenizer, log_stats)

    def _eos_token_ids(self) -> list[int]:
        """The tokenizer's eos first (it stops with stop_reason None), then the others."""
        mc = self.config.model_config
        ids = get_stop_token_ids(mc.model, self.tokenizer, mc.hf_config)
        primary = getattr(self.tokenizer, "eos_token_id", None)
        if primary in ids:
            ids = [primary] + [i for i in ids if i != primary]
        return ids

    def get_tokenizer(self) -> Any | None:
        return self.tokenizer

    def process_input(
        self,
        prompt: PromptType,
        params: SamplingParams,
        length_rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> tuple[str | None, list[int]]:
        return self.input_processor.process(prompt, params, length_rule)

    def register_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> list[EngineCoreRequest]:
        """Track a validated request; return the core requests (one per sample) to submit. Its
        outputs are of the kind `params.output_kind` asks for."""
        arrival = time.time() if arrival_time is None else arrival_time
        sample_ids = sample_request_ids(request_id, params.n)
        # User ids and the core ids of n > 1 samples share one namespace: refuse any overlap.
        taken = self.output_processor.sample_owner
        if request_id in self.output_processor.requests or request_id in taken or any(s in taken for s in sample_ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        self.output_processor.add_request(request_id, prompt, prompt_token_ids, params, sample_ids, arrival)
        params = schema_as_text(params)
        core_requests = []
        for i, sid in enumerate(sample_ids):
            child = params
            if params.n > 1:
                child = params.clone()
                child.n = 1
                if params.seed is not None:
                    child.seed = params.seed + i  # distinct yet reproducible samples
            core_requests.append(
                EngineCoreRequest(
                    sid,
                    prompt_token_ids,
                    child,
                    self.eos_token_ids,
                    arrival,
                    prefix_source_id=sample_ids[0] if i > 0 else None,
                )
            )
        return core_requests

    def submit(
        self,
        request_id: str,
        core_requests: list[EngineCoreRequest],
        send: Callable[[EngineCoreRequest], None],
        abort_sent: Callable[[list[str]], None],
    ) -> None:
        """Hand a registered request's core requests to the core, transactionally: if any fails
        (a message that cannot be encoded, a dead core), the request is unregistered and the samples
        already sent are aborted, so nothing is left holding a queue slot or KV blocks."""
        sent: list[str] = []
        try:
            for core_request in core_requests:
                send(core_request)
                sent.append(core_request.request_id)
        except BaseException:
            self.output_processor.abort_requests([request_id])
            if sent:
                abort_sent(sent)
            raise
