"""Every struct that crosses the process boundary between the API server and the engine core.

The API server process imports this module, never the engine core's: it holds no tensors, no model
and no torch, only msgspec structs of token ids, floats and sampling parameters. Each ZMQ message is
two frames, a one-byte kind and a msgpack payload. The structs are `array_like` (encoded as arrays,
without field names) and `gc=False` (they never hold reference cycles, so the garbage collector
need not track the thousands a busy server decodes per second).

What the engine core sends up each step (EngineCoreOutputs and the structs inside it, and
RequestError) is built by the scheduler, so it is defined below engine, in tram/core/outputs.py, and
re-exported here with the rest of the boundary.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tram.core.outputs import EngineCoreOutput, EngineCoreOutputs, RequestError, SchedulerStats, SpecDecodingCounts
from tram.core.sched_output import LogprobsLists
from tram.sampling_params import SamplingParams
from tram.sampling_params.structured import CHECKED_UPSTREAM

__all__ = [
    "EngineCoreRequest",
    "AbortRequests",
    "UtilityCall",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "LogprobsLists",
    "SchedulerStats",
    "SpecDecodingCounts",
    "RequestError",
    "UtilityResult",
    "ReadyInfo",
    "FatalError",
    "UTILITY_METHODS",
    "INPUT_DECODERS",
    "OUTPUT_DECODERS",
    "encode",
    "decode",
]

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
    # What arrives here was built, and checked, by the process at the other end of the socket:
    # decoding runs __post_init__, whose checks of a client's schema are not repeated (structured.py).
    token = CHECKED_UPSTREAM.set(True)
    try:
        return kind, decoders[kind].decode(frames[1])
    finally:
        CHECKED_UPSTREAM.reset(token)
