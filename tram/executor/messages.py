"""The frames between the engine core and its worker processes.

engine -> each rank:  [EXECUTE, msgpack(SchedulerOutput)] | [RPC, pickle((method, args))] | [SHUTDOWN]
rank -> engine:       [READY | OUTPUT | RESULT | ERROR, rank, payload]

A step's scheduler output is encoded once and the same bytes go to every rank; only rank 0 answers
a step (msgpack(ModelRunnerOutput)). An RPC is answered by every rank. ERROR carries a traceback and
means that rank is going away.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgspec

from tram.core.sched_output import ModelRunnerOutput, SchedulerOutput

EXECUTE, RPC, SHUTDOWN = b"E", b"C", b"S"
READY, OUTPUT, RESULT, ERROR = b"r", b"o", b"c", b"x"

_encoder = msgspec.msgpack.Encoder()
_sched_decoder = msgspec.msgpack.Decoder(SchedulerOutput)
_output_decoder = msgspec.msgpack.Decoder(ModelRunnerOutput)


def encode_sched(sched: SchedulerOutput) -> list[bytes]:
    return [EXECUTE, _encoder.encode(sched)]


def decode_sched(payload: bytes) -> SchedulerOutput:
    return _sched_decoder.decode(payload)


def encode_output(rank: int, output: ModelRunnerOutput) -> list[bytes]:
    return [OUTPUT, b"%d" % rank, _encoder.encode(output)]


def decode_output(payload: bytes) -> ModelRunnerOutput:
    return _output_decoder.decode(payload)


def encode_rpc(method: str, args: tuple[Any, ...]) -> list[bytes]:
    return [RPC, pickle.dumps((method, args))]


def reply(kind: bytes, rank: int, value: Any = None) -> list[bytes]:
    return [kind, b"%d" % rank, pickle.dumps(value)]
