"""What the grammar bitmask costs a decode step: step time with 0, 16 and 64 of 256 running requests
constrained by a JSON schema, and where the extra time goes.

    TOK=path/to/tokenizer.model   # Llama 2's SentencePiece model (llama2.c ships it); needs protobuf
    python3 benchmarks/structured_step_time.py --tokenizer $TOK --temperature 0 --prototype
    python3 benchmarks/structured_step_time.py --tokenizer $TOK --backend guidance --json /tmp/so.json
    python3 benchmarks/structured_step_time.py            # the preset's own 512-token tokenizer

The llama-15m preset (random weights, float32, CPU) holds --num-running requests in steady decode
(prompts 32..128 tokens, eos ignored, outputs longer than the run), the way host_overhead.py does,
and this script calls `LLMEngine.step()` itself and times each step. Of those requests 0, 16 or 64
(--constrained) carry a JSON schema; the configurations take turns (--rounds), each after a
warm-up, all in one process and one engine.

The preset's tokenizer has 512 tokens (the model's vocabulary is 32,000): a grammar never allows
the ids past them, so its matchers see a toy vocabulary. --tokenizer puts a real one in its place
(a folder, or a Llama SentencePiece `tokenizer.model`, converted to tokenizer.json on the fly).

The schemas allow arbitrarily long output (strings without maxLength, arrays without maxItems,
and an array of at least 8 strings in each, so that no request closes its JSON within the run);
a request whose grammar terminates would stop and shrink the batch, so every measured step is
checked to run all requests. At --temperature 1 (the default) a request walks the grammar at
random, but the random draw over [256, 32000] dominates the step on a CPU (~210 ms of ~350 here,
torch's `exponential_`); greedy (--temperature 0) keeps the step to the model, but random weights
then repeat one token forever (an endless string, integer or run of whitespace). The first gives
the fill and accept of varied grammar states, the second the mask's share of a lean step.

The extra cost is split by wrapping the methods that do it with timers (in this process only):
- fill: `StructuredOutputManager.grammar_bitmask`, the engine core's per-matcher fill of the rows;
- hand-over: `ModelRunner._set_grammar_bitmask`, the worker's copy of the bytes into a tensor;
- apply: `GrammarBitmaskProcessor.apply`, the worker's unpack of the bits and the -inf fill;
- accept: `StructuredOutputRequest.accept_token`, the matchers following the sampled tokens
  (in `StructuredOutputManager.advance`).
The wrappers add ~0.3 us a call (64 accept calls a step: ~20 us). Each is timed in wall time and in
the engine thread's CPU time, the step in wall time and the process's CPU time: with one torch
thread (the default: every usable core but one, as the engine core's beside a busy process) the CPU times leave out what
other processes on a shared machine took.

--prototype then times, on the live matchers and a bitmask of the last step, candidate
replacements for fill (xgrammar's BatchGrammarMatcher, llguidance's parallel executor) and apply
(xgrammar's CPU kernel, numpy's unpackbits, a byte lookup table) against the current code, each
checked to give the same bitmask or logits. Nothing in tram/ changes.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import _checkout  # this checkout's tram first on sys.path

del _checkout  # imported for that effect alone

# Four shapes of record, each with an unbounded tail (strings without maxLength, arrays without
# maxItems) so that a request never has to end; enums and integers give the grammar other states.
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "role": {"enum": ["admin", "editor", "viewer", "guest"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "notes": {"type": "array", "items": {"type": "string"}, "minItems": 8},
        },
        "required": ["name", "age", "role", "tags", "notes"],
    },
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
                "minItems": 8,
            },
            "comment": {"type": "string"},
        },
        "required": ["id", "status", "items", "comment"],
    },
    {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "kind": {"enum": ["meeting", "call", "talk"]},
            "location": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                "required": ["city", "country"],
            },
            "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 8},
            "summary": {"type": "string"},
        },
        "required": ["title", "kind", "location", "attendees", "summary"],
    },
    {
        "type": "object",
        "properties": {
            "level": {"enum": ["debug", "info", "warning", "error"]},
            "code": {"type": "integer"},
            "messages": {"type": "array", "items": {"type": "string"}, "minItems": 8},
        },
        "required": ["level", "code", "messages"],
    },
]
PARTS = ("fill", "hand-over", "apply", "accept")


class Timers:
    """Time spent in wrapped methods, by part, since the last `take()`: wall seconds, and CPU seconds
    of the calling thread (with one torch thread every part runs on the engine's thread, so its CPU
    time leaves out the time other processes on the machine held the core)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def wrap(self, owner: type, name: str, part: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu[part] += time.thread_time() - cpu
                self.wall[part] += time.perf_counter() - wall

        setattr(owner, name, timed)

    def take(self) -> tuple[dict[str, float], dict[str, float]]:
        """(wall, cpu) seconds by part since the last call."""
        out = {p: self.wall.get(p, 0.0) for p in PARTS}, {p: self.cpu.get(p, 0.0) for p in PARTS}
        self.wall.clear()
        self.cpu.clear()
        return out


def install_timers() -> Timers:
    from tram.structured_output.manager import StructuredOutputManager
    from tram.structured_output.request import StructuredOutputRequest
    from tram.worker.logits_processors.grammar_bitmask import GrammarBitmaskProcessor
    from tram.worker.model_runner import ModelRunner

    timers = Timers()
    timers.wrap(StructuredOutputManager, "grammar_bitmask", "fill")
    timers.wrap(ModelRunner, "_set_grammar_bitmask", "hand-over")
    timers.wrap(GrammarBitmaskProcessor, "apply", "apply")
    timers.wrap(StructuredOutputRequest, "accept_token", "accept")
    return timers


def constraint(i: int, whitespace: str) -> Any:
    from tram import StructuredOutputsParams

    compact = {"compact": True, "any": False}.get(whitespace, (i // len(SCHEMAS)) % 2 == 0)
    return StructuredOutputsParams(json=SCHEMAS[i % len(SCHEMAS)], disable_any_whitespace=compact)


def run_config(
    engine: Any, timers: Timers, args: argparse.Namespace, constrained: int, seed: int, vocab: int
) -> dict[str, Any]:
    """Add num_running requests (the first `constrained` with a schema), prefill them, warm up,
    then time `args.steps` steps; the requests are aborted after."""
    from tram import SamplingParams
    from tram.bench.datasets import random_requests
    from tram.bench.latency import prompts_done
    from tram.sampling_params import RequestOutputKind

    core = engine.engine_core
    reqs = random_requests(
        args.num_running, (32, 128), (args.max_tokens, args.max_tokens), vocab, seed=seed, exclude_ids=range(3)
    )
    ids = [f"c{constrained}-s{seed}-{i}" for i in range(len(reqs))]
    for i, (rid, r) in enumerate(zip(ids, reqs)):
        params = SamplingParams(
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
            structured_outputs=constraint(i, args.whitespace) if i < constrained else None,
        )
        engine.add_processed_request(rid, None, r.prompt_token_ids, params)  # waits for the compile
    while not prompts_done(engine):
        engine.step()
    for _ in range(args.warmup):
        engine.step()
    timers.take()
    wall_s, cpu_s = [], []
    parts: dict[str, dict[str, list[float]]] = {"wall": defaultdict(list), "cpu": defaultdict(list)}
    for _ in range(args.steps):
        wall, cpu = time.perf_counter(), time.process_time()
        engine.step()
        wall_s.append(time.perf_counter() - wall)
        cpu_s.append(time.process_time() - cpu)
        for clock, by_part in zip(("wall", "cpu"), timers.take()):
            for part, seconds in by_part.items():
                parts[clock][part].append(seconds)
        running = core.scheduler.running
        alive = sum(r.structured_output is not None for r in running)
        if len(running) != args.num_running or alive != constrained:
            raise RuntimeError(
                f"{len(running)} running ({alive} constrained) instead of {args.num_running} "
                f"({constrained}): a request finished; raise --max-tokens or change the schemas"
            )
    result = {
        "constrained": constrained,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "parts_s": {clock: dict(v) for clock, v in parts.items()},
        "loadavg": os.getloadavg(),
    }
    if args.prototype and constrained == max(args.constrained):
        result["prototype"] = prototype(core, args)
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return result


# ---- candidate replacements, timed on the live matchers -----------------------------------
def prototype(core: Any, args: argparse.Namespace) -> dict[str, float]:
    """ms per step of the current fill and apply and of candidate replacements, on this step's
    constrained requests (fill does not move a matcher, so it can be repeated)."""
    import numpy as np
    import torch

    from tram.bench.timing import best_ms
    from tram.worker.logits_processors.grammar_bitmask import GrammarBitmaskProcessor

    manager = core.structured_output
    states = [r.structured_output for r in core.scheduler.running if r.structured_output is not None]
    vocab, words = manager.backend.vocab_size, manager.words
    n, batch = len(states), args.num_running
    bitmask = np.full((n, words), -1, dtype=np.int32)
    out: dict[str, float] = {}

    def fill_loop() -> None:
        for row, s in enumerate(states):
            s.fill_bitmask(bitmask, row)

    out["fill: per-matcher loop (current)"] = best_ms(fill_loop, 5, 10)
    reference = bitmask.copy()
    allowed = np.unpackbits(reference.view(np.uint8), axis=1, bitorder="little")[:, :vocab].sum(1)
    out["allowed tokens per row (mean, not ms)"] = float(allowed.mean())
    for name, fn in batch_fills(manager.backend, [s.matcher for s in states], bitmask).items():
        bitmask.fill(0)
        out[name] = best_ms(fn, 5, 10)
        if not np.array_equal(bitmask, reference):
            raise AssertionError(f"{name} filled a different bitmask")

    # Apply: the constrained rows spread over the batch, as the persistent batch has them.
    rows = sorted(np.random.default_rng(0).choice(batch, n, replace=False).tolist())
    logits0 = torch.randn(batch, vocab)
    processor = GrammarBitmaskProcessor(vocab, torch.device("cpu"))
    processor.set_step(rows, reference)
    rows_t = torch.tensor(rows)
    expected = processor.apply(logits0.clone())
    packed = reference.view(np.uint8)  # [R, 4 * words]: little-endian, so bit j of byte b is token 8b + j

    def numpy_rows(logits: torch.Tensor) -> None:
        # CPU only: numpy's unpackbits, then -inf written where a row's bit is 0, row by row in place.
        allowed = np.unpackbits(packed, axis=1, bitorder="little")[:, :vocab].view(np.bool_)
        out_np = logits.numpy()
        for i, row in enumerate(rows):
            np.copyto(out_np[row], -np.inf, where=~allowed[i])

    # Any device: each byte looks up its 8 additive biases (0 or -inf), added to the rows in place.
    byte_bits = torch.from_numpy(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"))
    byte_bias = torch.zeros(256, 8).masked_fill_(byte_bits == 0, float("-inf"))
    packed_t = torch.from_numpy(packed).reshape(-1).long()

    def lookup_bias(logits: torch.Tensor) -> None:
        bias = torch.nn.functional.embedding(packed_t, byte_bias).view(n, -1)[:, :vocab]
        logits.index_add_(0, rows_t, bias)

    candidates: dict[str, Callable[[torch.Tensor], Any]] = {
        "apply: torch int32 unpack + masked_fill (current)": processor.apply,
        "apply: numpy unpackbits + np.copyto(where=) per row": numpy_rows,
        "apply: byte lookup table (F.embedding) + index_add_": lookup_bias,
    }
    try:
        import xgrammar as xgr

        # Its bitmask is batch-shaped (indices pick logits and bitmask rows alike): the rows are
        # scattered into a persistent [batch, words] buffer first, and that is timed too.
        full = torch.full((batch, words), -1, dtype=torch.int32)
        bm_t = torch.from_numpy(reference)

        def xgrammar_kernel(logits: torch.Tensor) -> None:
            full.index_copy_(0, rows_t, bm_t)
            xgr.apply_token_bitmask_inplace(logits, full, vocab_size=vocab, indices=rows)

        candidates["apply: xgrammar CPU kernel (rows scattered into [B, words])"] = xgrammar_kernel
    except ImportError:
        pass
    for name, fn in candidates.items():
        got = logits0.clone()
        fn(got)
        if not torch.equal(got, expected):  # (adding 0 turns -0.0 into 0.0: equal here, and to sampling)
            raise AssertionError(f"{name} masked differently")
        # A fresh copy per call would dominate; the masked logits stay valid input (-inf stays -inf).
        work = logits0.clone()
        out[name] = best_ms(lambda fn=fn, work=work: fn(work), 5, 10)
    return out


def batch_fills(backend: Any, matchers: list[Any], bitmask: Any) -> dict[str, Callable[[], None]]:
    """One call that fills every row, per backend, with 1 and 2 threads."""
    import torch

    fills: dict[str, Callable[[], None]] = {}
    if backend.name == "xgrammar":
        import xgrammar as xgr

        xm = [m.matcher for m in matchers]
        bm_t = torch.from_numpy(bitmask)
        for threads in (1, 2):
            batcher = xgr.BatchGrammarMatcher(max_threads=threads)
            fills[f"fill: xgr.BatchGrammarMatcher, {threads} thread(s)"] = lambda b=batcher: (
                b.batch_fill_next_token_bitmask(xm, bm_t)
            )
    else:
        import llguidance
        import llguidance.numpy

        pairs = [(m.matcher, row) for row, m in enumerate(matchers)]
        for threads in (1, 2):
            executor = llguidance.LLExecutor(num_threads=threads)
            fills[f"fill: llguidance fill_next_token_bitmask_par, {threads} thread(s)"] = lambda e=executor: (
                llguidance.numpy.fill_next_token_bitmask_par(e, pairs, bitmask)
            )
    return fills


def tokenizer_folder(path: str | None) -> str | None:
    """A tokenizer folder as given, or one converted from a SentencePiece `.model` file (a fast
    tokenizer.json, which Tram needs; the conversion needs the protobuf package)."""
    if path is None or not path.endswith(".model"):
        return path
    import json
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    src, out = tempfile.mkdtemp(prefix="sp-"), tempfile.mkdtemp(prefix="tokenizer-")
    shutil.copyfile(path, os.path.join(src, "tokenizer.model"))
    with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "legacy": True,
            },
            f,
        )
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    shutil.rmtree(src)
    return out


# ---- report ---------------------------------------------------------------------------------
def summarize(results: list[dict[str, Any]], constrained: list[int]) -> list[dict[str, Any]]:
    """Per configuration and clock ("wall", "cpu"): step mean and median, each part's mean per step,
    the mask (the parts' sum) per step, its share of the mean step and the median step's growth
    over the unconstrained one."""
    rows = []
    for k in constrained:
        runs = [r for r in results if r["constrained"] == k]
        row: dict[str, Any] = {
            "constrained": k,
            "steps": sum(len(r["wall_s"]) for r in runs),
            "loadavg_1min": [r["loadavg"][0] for r in runs],
        }
        for clock in ("wall", "cpu"):
            steps = [s for r in runs for s in r[f"{clock}_s"]]
            stats = {"mean_ms": 1e3 * statistics.fmean(steps), "median_ms": 1e3 * statistics.median(steps)}
            for part in PARTS:
                values = [s for r in runs for s in r["parts_s"][clock].get(part, [])]
                stats[f"{part}_ms"] = 1e3 * statistics.fmean(values) if values else 0.0
            stats["mask_ms"] = sum(stats[f"{p}_ms"] for p in PARTS)
            stats["mask_share"] = stats["mask_ms"] / stats["mean_ms"]
            row[clock] = stats
        rows.append(row)
    if rows and rows[0]["constrained"] == 0:
        for row in rows:
            for clock in ("wall", "cpu"):
                row[clock]["extra_median_ms"] = row[clock]["median_ms"] - rows[0][clock]["median_ms"]
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, clock: str) -> None:
    what = {"wall": "wall time", "cpu": "CPU time (the step: the process's; the parts: the engine thread's)"}
    print(
        f"\n{args.backend}, {args.num_running} running, whitespace {args.whitespace}, temperature "
        f"{args.temperature}, {args.threads} torch thread(s); {what[clock]}, ms per step (parts: mean)\n"
    )
    print(
        "| constrained | steps | step mean | step median | median - unconstrained | fill | hand-over | apply "
        "| accept | mask | mask / mean step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = row[clock]
        extra = f"{r['extra_median_ms']:+.1f}" if "extra_median_ms" in r else "-"
        print(
            f"| {row['constrained']} | {row['steps']} | {r['mean_ms']:.1f} | {r['median_ms']:.1f} | {extra} "
            f"| {r['fill_ms']:.2f} | {r['hand-over_ms']:.2f} | {r['apply_ms']:.2f} | {r['accept_ms']:.2f} "
            f"| {r['mask_ms']:.2f} | {100 * r['mask_share']:.1f}% |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["xgrammar", "guidance"], default="xgrammar")
    p.add_argument("--model", default="llama-15m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-running", type=int, default=256)
    p.add_argument("--constrained", type=int, nargs="+", default=[0, 16, 64])
    p.add_argument(
        "--whitespace",
        choices=["mix", "compact", "any"],
        default="mix",
        help="disable_any_whitespace on every other schema (mix), on all (compact) or on none (any)",
    )
    p.add_argument("--max-tokens", type=int, default=880, help="prompt (<= 128) + output must fit the context")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="1.0 walks the grammar; greedy on random weights repeats one token forever",
    )
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50, help="timed steps per configuration and round")
    p.add_argument("--rounds", type=int, default=2, help="the configurations take turns this many times")
    p.add_argument(
        "--threads",
        type=int,
        default=max(1, len(os.sched_getaffinity(0)) - 1),
        help="torch threads (default: every usable core but one, as the engine core's beside a busy process)",
    )
    p.add_argument(
        "--tokenizer",
        help="a tokenizer folder, or a Llama SentencePiece tokenizer.model, in place of "
        "the preset's (512 tokens: a grammar never allows the ids past them, so fills are unrealistic)",
    )
    p.add_argument(
        "--prototype", action="store_true", help="also time candidate fills and applies at the largest --constrained"
    )
    p.add_argument("--json", help="write the results and machine_info() here")
    args = p.parse_args()

    import torch

    from tram import LLM
    from tram.bench.presets import resolve_model
    from tram.bench.report import machine_info, machine_summary, write_json

    torch.set_num_threads(args.threads)
    tokenizer_path = tokenizer_folder(args.tokenizer)
    print(machine_summary())
    llm = LLM(
        resolve_model(args.model),
        load_format="dummy",
        dtype=args.dtype,
        max_num_seqs=args.num_running,
        structured_outputs_backend=args.backend,
        tokenizer=tokenizer_path,
    )
    engine = llm.llm_engine
    vocab = engine.engine_core.config.model_config.vocab_size
    tokens = len(llm.get_tokenizer())
    print(
        f"torch {torch.__version__}; tokenizer: {args.tokenizer or 'the preset'} ({tokens} tokens); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    timers = install_timers()
    results = []
    for r in range(args.rounds):
        for k in args.constrained:
            res = run_config(engine, timers, args, k, seed=r, vocab=vocab)
            print(
                f"round {r + 1}, {k} constrained: median step {1e3 * statistics.median(res['wall_s']):.1f} ms "
                f"(CPU {1e3 * statistics.median(res['cpu_s']):.1f} ms), load average {res['loadavg'][0]:.2f}",
                flush=True,
            )
            results.append(res)
    rows = summarize(results, args.constrained)
    for clock in ("cpu", "wall"):
        print_table(rows, args, clock)
    protos = [r["prototype"] for r in results if "prototype" in r]
    if protos:
        print(f"\ncandidates at {max(args.constrained)} constrained (best ms per call; last round's matchers):")
        for name, ms in protos[-1].items():
            print(f"  {name:<60} {ms:8.3f}")
    if args.json:
        write_json(
            args.json,
            {"args": vars(args), "machine": machine_info(), "table": rows, "prototype": protos, "runs": results},
        )


if __name__ == "__main__":
    main()
