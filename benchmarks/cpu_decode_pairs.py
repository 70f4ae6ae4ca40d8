"""A decode step with the layers' bf16 weights on their pairs copies beside oneDNN's, against oneDNN's alone.

cpu_packed.pack_with_pairs gives each layer's bfloat16 weight a copy packed in pairs of k for a decode
step's rows (3 .. PAIR_ROWS), where the kernels prefer pairs (AVX512-BF16 without AMX). This runs
--batch requests of --context prompt tokens on a preset with dummy weights, then times decode steps in
rounds that take turns: the modules' packed weights as loaded (pairs for these rows), and the same
modules pointed at the oneDNN copy alone. Same process, same requests, so a VM's drift slows both alike;
the table reports each round's median step and the ratio of the medians over rounds.

    python3 benchmarks/cpu_decode_pairs.py --model llama-110m --batch 4 16 32 --rounds 6

--program instead compares two forms of the layer programs (layers/cpu_decode.py), both on the pairs
copies: calling pair_linear themselves, and leaving those rows to the modules (as before the programs
knew the pairs copies).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)

SLOTS = ("packed_weight", "packed_qkv", "packed_gate_up")


def pair_slots(model: Any) -> list[tuple[Any, str, Any]]:
    from tram.model.layers.cpu_packed import DecodePairs

    return [
        (m, slot, getattr(m, slot))
        for m in model.modules()
        for slot in SLOTS
        if isinstance(getattr(m, slot, None), DecodePairs)
    ]


def timed_steps(engine: Any, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def switch_onednn(model: Any, slots: list[tuple[Any, str, Any]], on: bool) -> None:
    """The modules' packed weights: oneDNN's copy alone (on) or as loaded."""
    for module, slot, both in slots:
        setattr(module, slot, both.onednn if on else both)


def switch_program_pairs(model: Any, slots: list[tuple[Any, str, Any]], on: bool) -> None:
    """The layer programs without their pairs groups (on: the modules take those rows), rebuilt."""
    from tram.model.layers import cpu_decode

    if not hasattr(cpu_decode, "_saved_pairs_linear"):
        cpu_decode._saved_pairs_linear = cpu_decode._pairs_linear
    cpu_decode._pairs_linear = (lambda *args: None) if on else cpu_decode._saved_pairs_linear
    for layer in model.model.layers:
        layer.cpu_decode = None  # rebuilt at its next forward


def run(
    model_name: str, batch: int, context: int, rounds: int, steps: int, program: bool
) -> tuple[list[float], list[float]]:
    from tram import LLM, SamplingParams
    from tram.bench.presets import resolve_model

    llm = LLM(
        resolve_model(model_name),
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=context + 2 * rounds * steps + 64,
        max_num_seqs=batch,
        seed=0,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
    )
    engine = llm.llm_engine
    model = engine.engine_core.executor.model_runner.model
    slots = pair_slots(model)
    switch = switch_program_pairs if program else switch_onednn
    if not slots:
        raise SystemExit("no pairs copies here (the kernels do not prefer pairs, or they did not fit)")
    params = SamplingParams(temperature=0.0, max_tokens=2 * rounds * steps + 16, ignore_eos=True)
    ids = [f"r{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, {"prompt_token_ids": [7 + i] * context}, params)
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step() if o.outputs and o.outputs[0].token_ids)
    timed_steps(engine, 4)
    with_pairs, without = [], []
    for _ in range(rounds):
        with_pairs.append(timed_steps(engine, steps))
        switch(model, slots, True)
        without.append(timed_steps(engine, steps))
        switch(model, slots, False)
    engine.abort_request(ids)
    return with_pairs, without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-110m")
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--program", action="store_true", help="the programs' pairs groups against none")
    args = parser.parse_args()
    os.environ.setdefault("TRAM_CPU_THREADS", str(args.threads))
    from tram.bench.report import machine_summary

    print(machine_summary())
    print(f"{args.model} bfloat16, prompts of {args.context} tokens, median ms per decode step\n")
    before, after = ("modules past 2 rows", "program's pairs") if args.program else ("oneDNN alone", "pairs")
    print(f"| batch | {before} | {after} | ratio | rounds ({before} / {after}) |")
    print("|---|---|---|---|---|")
    for batch in args.batch:
        pairs, onednn = run(args.model, batch, args.context, args.rounds, args.steps, args.program)
        a, b = statistics.median(onednn), statistics.median(pairs)
        rounds = ", ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(onednn, pairs))
        print(f"| {batch} | {a:.2f} | {b:.2f} | **{b / a:.2f}** | {rounds} |", flush=True)


if __name__ == "__main__":
    main()
