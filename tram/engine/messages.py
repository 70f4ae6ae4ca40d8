"""Every struct that crosses the process boundary between the API server and the engine core.

The API server process imports this module, never the engine core's: it holds no tensors, no model
and no torch, only msgspec structs of token ids, floats and sampling parameters. Each ZMQ message is
two frames, a one-byte kind and a msgpack payload. The structs are `array_like` (encoded as arrays,
without field names) and `gc=False` (they never hold reference cycles, so the garbage collector
need not track the thousands a busy server decodes per second).
"""
from __future__ import annotations

from typing import Any

import msgspec

from tram.sampling_params import SamplingParams

_STRUCT = dict(array_like=True, omit_defaults=True, gc=False)


# ---- API server -> engine core ----------------------------------------------------------------

class EngineCoreRequest(msgspec.Struct, **_STRUCT):
    """One sequence to generate (a request with n > 1 becomes n of these)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int]  # the tokenizer's eos first, then other ids that end generation
    arrival_time: float
    prefix_source_id: str | None = None  # a sibling (n > 1) whose prompt KV to share


class AbortRequests(msgspec.Struct, **_STRUCT):
    request_ids: list[str]
    stopped: bool = False  # finished by a stop string (status STOPPED) rather than aborted


class UtilityCall(msgspec.Struct, **_STRUCT):
    """A call of one of UTILITY_METHODS on the engine core; answered by a UtilityResult."""

    call_id: int
    method: str
    args: list[Any] = []


# ---- engine core -> API server ----------------------------------------------------------------

class LogprobsLists(msgspec.Struct, **_STRUCT):
    """Per position: column 0 is the chosen token, the rest the top-k in descending order."""

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]  # 1-based rank of the chosen token in the whole vocabulary


class EngineCoreOutput(msgspec.Struct, **_STRUCT):
    """What one step produced for one sequence: only the new tokens, never the history."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    new_logprobs: LogprobsLists | None = None
    new_prompt_logprobs: LogprobsLists | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None  # seconds from arrival to first scheduled; on the first token only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, **_STRUCT):
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # cumulative, in tokens
    prefix_cache_hits: int = 0  # cumulative, in tokens
    num_preemptions: int = 0  # cumulative
    num_scheduled_tokens: int = 0  # this step
    # Structured outputs: running totals, and the compile times since the last report.
    structured_output_requests: int = 0
    grammar_compile_failures: int = 0
    grammar_cache_hits: int = 0
    grammar_compile_seconds: list[float] = []


class EngineCoreOutputs(msgspec.Struct, **_STRUCT):
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    request_errors: list["RequestError"] = []  # requests that ended in this step because they were bad


class UtilityResult(msgspec.Struct, **_STRUCT):
    call_id: int
    result: Any = None  # plain msgpack values (structs are sent as dicts)
    error: str | None = None


class ReadyInfo(msgspec.Struct, **_STRUCT):
    """Sent once the engine core has loaded the model and sized its KV cache."""

    num_blocks: int
    block_size: int
    max_model_len: int
    dtype: str  # what "auto" resolved to in the engine core
    device: str


class RequestError(msgspec.Struct, **_STRUCT):
    request_id: str
    message: str
    param: str | None = None  # the request field at fault, when it is the client's
    client_error: bool = False  # the request was bad (a 400), not the engine (a 500)


class FatalError(msgspec.Struct, **_STRUCT):
    message: str


# ---- framing ------------------------------------------------------------------------------------

# API server -> engine core
ADD = b"A"
ABORT = b"X"
UTILITY = b"U"
# engine core -> API server
READY = b"R"
OUTPUTS = b"O"
REQUEST_ERROR = b"E"
UTILITY_RESULT = b"u"
FATAL = b"F"

# Engine-core methods the server may call by name (nothing else is dispatched).
UTILITY_METHODS = frozenset({"get_stats", "check_kv_integrity", "reset_prefix_cache"})

_ENCODER = msgspec.msgpack.Encoder()
INPUT_DECODERS: dict[bytes, msgspec.msgpack.Decoder] = {
    ADD: msgspec.msgpack.Decoder(EngineCoreRequest),
    ABORT: msgspec.msgpack.Decoder(AbortRequests),
    UTILITY: msgspec.msgpack.Decoder(UtilityCall),
}
OUTPUT_DECODERS: dict[bytes, msgspec.msgpack.Decoder] = {
    READY: msgspec.msgpack.Decoder(ReadyInfo),
    OUTPUTS: msgspec.msgpack.Decoder(EngineCoreOutputs),
    REQUEST_ERROR: msgspec.msgpack.Decoder(RequestError),
    UTILITY_RESULT: msgspec.msgpack.Decoder(UtilityResult),
    FATAL: msgspec.msgpack.Decoder(FatalError),
}


def encode(kind: bytes, msg: msgspec.Struct) -> list[bytes]:
    return [kind, _ENCODER.encode(msg)]


def decode(frames: list[bytes], decoders: dict[bytes, msgspec.msgpack.Decoder]) -> tuple[bytes, Any]:
    kind = bytes(frames[0])
    return kind, decoders[kind].decode(frames[1])
