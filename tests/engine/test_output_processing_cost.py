"""The cost of one `OutputProcessor.process_outputs` step must not grow with the length already
generated for DELTA and FINAL_ONLY outputs (CUMULATIVE copies everything so far by definition).

Counted in bytes allocated (tracemalloc's peak above the start of each call), not timed: synthetic
core outputs for a few streams, with the real stories260K tokenizer, a stop string and logprobs,
after a short and after a long history.
"""

from __future__ import annotations

import functools
import os
import tracemalloc

import pytest

from tram.engine.messages import EngineCoreOutput, LogprobsLists
from tram.engine.output_processor import OutputProcessor
from tram.engine.tokenizer import load_tokenizer
from tram.sampling_params import RequestOutputKind, SamplingParams

MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models", "stories260K"))
STREAMS, STEPS, TOP = 8, 64, 5
SHORT, LONG = 64, 4096


@functools.cache
def story_ids() -> list[int]:
    tok = load_tokenizer(MODEL)
    text = "Once upon a time there was a little girl named Lily. She loved to play outside in the sun. "
    return tok.encode(text * 4, add_special_tokens=False)


def core_output(rid: str, ids: list[int], logprobs: bool) -> EngineCoreOutput:
    lps = None
    if logprobs:
        rows = [[t] + [(t + k) % 512 for k in range(1, TOP + 1)] for t in ids]
        lps = LogprobsLists(rows, [[-0.5 - 0.1 * k for k in range(TOP + 1)] for _ in ids], [1] * len(ids))
    return EngineCoreOutput(rid, ids, new_logprobs=lps)


def processor_after(history: int, kind: RequestOutputKind, logprobs: bool) -> OutputProcessor:
    """Streams that have generated about `history` tokens each (staggered, so that list resizes
    do not all fall on one step)."""
    proc = OutputProcessor(load_tokenizer(MODEL))
    params = SamplingParams(max_tokens=None, stop=["never seen"], logprobs=TOP if logprobs else None, output_kind=kind)
    for s in range(STREAMS):
        proc.add_request(f"r{s}", None, [1, 403], params, [f"r{s}"], 0.0)
    ids, done = story_ids(), 0
    target = history + 7 * STREAMS
    while done < target:
        size = min(256, target - done)
        chunk = [ids[(done + i) % len(ids)] for i in range(size)]
        outs = [
            core_output(f"r{s}", chunk[: size - (7 * s if done + size == target else 0)] or chunk[:1], logprobs)
            for s in range(STREAMS)
        ]
        proc.process_outputs(outs)
        done += size
    return proc


def bytes_per_step(history: int, kind: RequestOutputKind, logprobs: bool) -> float:
    proc = processor_after(history, kind, logprobs)
    ids = story_ids()

    def step_outputs(step: int) -> list[EngineCoreOutput]:
        return [core_output(f"r{s}", [ids[(step + s) % len(ids)]], logprobs) for s in range(STREAMS)]

    # Single-token steps first, as in decoding, so that no piece of the warm-up's long chunks is
    # still waiting to be compacted into the detokenizer's text.
    for step in range(STEPS):
        proc.process_outputs(step_outputs(step))
    tracemalloc.start()
    try:
        total = 0
        for step in range(STEPS):
            outs = step_outputs(step)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            emitted, _ = proc.process_outputs(outs)
            total += tracemalloc.get_traced_memory()[1] - before
            del emitted
        return total / STEPS
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("logprobs", [False, True], ids=["no_logprobs", "logprobs"])
@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY], ids=lambda k: k.name)
def test_step_cost_is_flat_in_the_length_generated(kind, logprobs):
    short, long = bytes_per_step(SHORT, kind, logprobs), bytes_per_step(LONG, kind, logprobs)
    assert long < 1.3 * short + 1024, (short, long)


@pytest.mark.parametrize("logprobs", [False, True], ids=["no_logprobs", "logprobs"])
def test_cumulative_step_cost_grows_and_the_measure_sees_it(logprobs):
    short, long = (
        bytes_per_step(SHORT, RequestOutputKind.CUMULATIVE, logprobs),
        bytes_per_step(LONG, RequestOutputKind.CUMULATIVE, logprobs),
    )
    assert long > 10 * short, (short, long)
