"""Messages between the API server process and the engine core process.

Each ZMQ message is two frames: a one-byte kind and a msgspec/msgpack payload. Only token ids, sampling
parameters and small stats cross; never tensors or tokenizers.
"""
from __future__ import annotations

from typing import Any

import msgspec

from tram.core.outputs import EngineCoreOutputs
from tram.engine.core import EngineCoreRequest

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


class AbortRequests(msgspec.Struct):
    request_ids: list[str]
    stopped: bool = False  # finished by a stop string (status STOPPED) rather than aborted


class UtilityCall(msgspec.Struct):
    call_id: int
    method: str
    args: list[Any] = []


class UtilityResult(msgspec.Struct):
    call_id: int
    result: Any = None
    error: str | None = None


class ReadyInfo(msgspec.Struct):
    num_blocks: int
    block_size: int
    max_model_len: int


class RequestError(msgspec.Struct):
    request_id: str
    message: str


class FatalError(msgspec.Struct):
    message: str


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
