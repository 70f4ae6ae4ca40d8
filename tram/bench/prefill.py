"""`tram bench latency --prefill`: time to first token of prompt-only workloads, Tram beside its peers.

    tram bench latency --prefill --model qwen2.5-0.5b --dtype bfloat16 --workloads 1x2048,16x512 \\
        --backend tram,vllm [--llama-server-url http://127.0.0.1:8080] --threads 2

A workload BxL submits B prompts of L random token ids at once, each asking for one output token, so
a request's time to first token (TTFT) is its prompt's prefill plus the step that samples the token.
Each backend runs --num-iters-warmup untimed and --num-iters timed batches of every workload, the
same token ids for all, and reports per workload the best batch's mean TTFT and last TTFT (when the
whole batch is prefilled), and prefill tokens/s (the batch's prompt tokens over its last TTFT).

Backends: `tram` (this process, offline engine, stepped), `vllm-eager` / `vllm-compile` (`vllm` for
both; vLLM's CPU build in its own environment, stepped the same way: tram/bench/vllm_runner.py), and
`llama-server`, which has no offline API: a running server (--llama-server-url; `benchmarks/
llama_cpp_peer.py prefill` starts one on the same model) gets the prompts as token ids over HTTP, all
of a batch at once, n_predict 1 and no prompt cache; HTTP adds about a millisecond to its TTFT.
`benchmarks/cpu_roofline.py --prefill-results FILE` puts each result beside the GEMM roofline.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tram.bench.datasets import random_requests
from tram.bench.report import machine_info, machine_summary, thread_settings, write_json
from tram.bench.throughput import add_vllm_flags, backend_names, model_checkpoint, tram_llm, vllm_llm_kwargs

BACKENDS = ("tram", "vllm-eager", "vllm-compile", "llama-server")
ALIASES = {"vllm": ("vllm-eager", "vllm-compile")}
DEFAULT_WORKLOADS = "1x2048,16x512"


@dataclass(frozen=True)
class Workload:
    batch: int
    prompt_len: int

    @property
    def name(self) -> str:
        return f"{self.batch}x{self.prompt_len}"


@dataclass
class PrefillResult:
    backend: str
    workload: str
    ttft: list[list[float]]  # seconds, per timed batch, per request
    info: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        batch, length = (int(x) for x in self.workload.split("x"))
        return batch * length

    @property
    def last_s(self) -> float:
        """The best batch's time until every prompt had its token."""
        return min(max(times) for times in self.ttft)

    @property
    def mean_s(self) -> float:
        return min(sum(times) / len(times) for times in self.ttft)

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens / self.last_s


def add_prefill_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill", action="store_true", help="time to first token of --workloads, on --backend")
    p.add_argument(
        "--workloads", default=DEFAULT_WORKLOADS, help="--prefill: comma-separated BxL (B prompts of L tokens at once)"
    )
    p.add_argument("--backend", default="tram", help="--prefill, comma-separated: " + ",".join(BACKENDS + ("vllm",)))
    p.add_argument("--llama-server-url", help="--prefill: a llama-server serving the same model (backend llama-server)")
    add_vllm_flags(p)


def parse_workloads(text: str) -> list[Workload]:
    """'1x2048,16x512' -> [Workload(1, 2048), Workload(16, 512)]."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"bad workload {item!r}: expected BxL, e.g. 16x512 (B prompts of L tokens)")
        out.append(Workload(int(parts[0]), int(parts[1])))
    if not out:
        raise ValueError("no workloads given")
    return out


def workload_batches(w: Workload, count: int, vocab_size: int, seed: int) -> list[list[list[int]]]:
    """`count` batches of `w`'s prompts: the same token ids for every backend."""
    batches = []
    for n in range(count):
        reqs = random_requests(w.batch, (w.prompt_len,) * 2, (1, 1), vocab_size, seed=seed + 1000 * n + w.prompt_len)
        batches.append([r.prompt_token_ids for r in reqs])
    return batches


def tram_first_token_times(engine: Any, batch: list[list[int]], tag: str) -> list[float]:
    """Seconds from submitting `batch` to each prompt's one output token, stepping Tram's engine."""
    from tram.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    for ids in batch:  # as LLM.generate would: a clear error, not a failed step, when one cannot fit
        engine.input_processor.check_prompt_length(len(ids), 1)
    times = [0.0] * len(batch)
    start = time.perf_counter()
    for i, ids in enumerate(batch):
        engine.add_processed_request(f"{tag}-{i}", None, ids, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                times[int(out.request_id.rsplit("-", 1)[1])] = time.perf_counter() - start
    return times


def run_tram(model: str, args: argparse.Namespace, plan: dict[Workload, list]) -> list[PrefillResult]:
    max_batch = max(w.batch for w in plan)
    llm = tram_llm(model, args, max(args.max_num_seqs, max_batch), enable_prefix_caching=False)
    results = []
    for w, batches in plan.items():
        times = [tram_first_token_times(llm.llm_engine, b, f"{w.name}.{n}") for n, b in enumerate(batches)]
        results.append(PrefillResult("tram", w.name, times[args.num_iters_warmup :], {"threads": thread_settings()}))
    del llm
    gc.collect()
    return results


def run_vllm(name: str, model: str, args: argparse.Namespace, plan: dict[Workload, list]) -> list[PrefillResult]:
    from tram.bench import vllm_peer

    args = argparse.Namespace(**vars(args))
    args.max_num_seqs = max(args.max_num_seqs, *(w.batch for w in plan))
    batches = [b for bs in plan.values() for b in bs]
    out = vllm_peer.run_vllm_ttft(
        name,
        args.vllm_python or vllm_peer.default_python(),
        vllm_llm_kwargs(name, model, args),
        batches,
        args.threads,
        args.vllm_kvcache_gb,
    )
    info = {k: out.get(k) for k in ("env", "llm_kwargs", "config", "setup_seconds", "vllm_version")}
    results, times = [], iter(out["ttft"])
    for w, bs in plan.items():
        mine = [next(times) for _ in bs]
        results.append(PrefillResult(name, w.name, mine[args.num_iters_warmup :], info))
    return results


def llama_server_completion(url: str, ids: list[int], start: float) -> tuple[float, dict]:
    """POST one prompt (token ids) for one token; seconds from `start` to the answer, and its timings."""
    body = json.dumps({"prompt": ids, "n_predict": 1, "cache_prompt": False, "temperature": 0.0}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as resp:
        answer = json.loads(resp.read())
    return time.perf_counter() - start, answer.get("timings", {})


def llama_server_batch(url: str, batch: list[list[int]]) -> tuple[list[float], list[dict]]:
    with ThreadPoolExecutor(len(batch)) as pool:
        start = time.perf_counter()
        done = list(pool.map(lambda ids: llama_server_completion(url, ids, start), batch))
    return [t for t, _ in done], [timings for _, timings in done]


def run_llama_server(args: argparse.Namespace, plan: dict[Workload, list]) -> list[PrefillResult]:
    if not args.llama_server_url:
        raise ValueError(
            "backend llama-server needs --llama-server-url (benchmarks/llama_cpp_peer.py prefill starts one)"
        )
    results = []
    for w, batches in plan.items():
        runs = [llama_server_batch(args.llama_server_url, b) for b in batches][args.num_iters_warmup :]
        prompt_ms = [max(t.get("prompt_ms", 0.0) for t in timings) for _, timings in runs]
        info = {"url": args.llama_server_url, "server_prompt_ms": prompt_ms}
        results.append(PrefillResult("llama-server", w.name, [times for times, _ in runs], info))
    return results


def print_report(results: list[PrefillResult]) -> dict[str, float]:
    """The table, and per workload Tram's last TTFT against the best peer's (> 1: Tram is faster)."""
    header = f"{'workload':<9} {'backend':<13} {'mean TTFT ms':>12} {'last TTFT ms':>12} {'prefill tok/s':>13}"
    print(header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r.workload:<9} {r.backend:<13} {r.mean_s * 1e3:>12.1f} {r.last_s * 1e3:>12.1f} {r.tokens_per_s:>13.1f}"
        )
    ratios = {}
    for workload in dict.fromkeys(r.workload for r in results):
        rows = {r.backend: r for r in results if r.workload == workload}
        peers = [r for name, r in rows.items() if name != "tram"]
        if "tram" in rows and peers:
            best = min(peers, key=lambda r: r.last_s)
            ratios[workload] = best.last_s / rows["tram"].last_s
            print(
                f"{workload}: tram's last TTFT is {ratios[workload]:.2f}x as fast as the best peer's ({best.backend}); "
                f"mean TTFT {best.mean_s / rows['tram'].mean_s:.2f}x"
            )
    return ratios


def run_prefill(args: argparse.Namespace) -> dict:
    from transformers import AutoConfig

    torch.set_num_threads(args.threads)
    names = backend_names(args.backend, BACKENDS, ALIASES)
    workloads = parse_workloads(args.workloads)
    if any(n in ALIASES["vllm"] for n in names):  # a missing vLLM environment fails now, not after Tram's run
        from tram.bench.vllm_peer import check_python, default_python

        check_python(args.vllm_python or default_python())
    args.enable_prefix_caching = False  # random prompts share no prefix; no engine should hash them
    model = model_checkpoint(args)
    if model.endswith(".gguf"):
        from tram.model.gguf.file import load_gguf_config

        vocab = load_gguf_config(model).vocab_size
    else:
        vocab = AutoConfig.from_pretrained(model).vocab_size
    count = args.num_iters_warmup + args.num_iters
    plan = {w: workload_batches(w, count, vocab, args.seed) for w in workloads}
    print(machine_summary())
    print(f"prefill: workloads {args.workloads}, model {args.model} ({model}), {args.dtype}, {args.threads} threads")
    results: list[PrefillResult] = []
    for name in names:
        if name == "tram":
            results += run_tram(model, args, plan)
        elif name == "llama-server":
            results += run_llama_server(args, plan)
        else:
            results += run_vllm(name, model, args, plan)
    ratios = print_report(results)
    report = {
        "machine": machine_info(),
        "args": vars(args),
        "results": [
            asdict(r) | {"last_ms": r.last_s * 1e3, "mean_ms": r.mean_s * 1e3, "prefill_tokens_per_s": r.tokens_per_s}
            for r in results
        ],
        "ratios": ratios,
    }
    if args.output_json:
        write_json(args.output_json, report)
    return report
