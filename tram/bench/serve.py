"""`tram bench serve`: an online benchmark client for any OpenAI-compatible server (Tram, vLLM,
llama.cpp's `llama-server`), so that one client sends identical requests to Tram and to a peer.

Modelled on vLLM's `benchmark_serving`: a seeded workload of token-id prompts (`datasets.py`), sent as
streamed completions with `ignore_eos` so every server generates exactly the requested lengths, with
gamma-distributed arrivals (`--request-rate`, `--burstiness`) and an optional cap on requests in
flight (`--max-concurrency`). TTFT and inter-token gaps are taken from the SSE chunks as they arrive;
token counts from the usage the server reports. `--sweep` repeats the run over a list of loads (and
over several `--base-url`s) and draws the curves with `sweep_plot.py`.

Programmatic use (the llama.cpp comparison script):
    result = await benchmark(base_url, model, requests, request_rate=math.inf, max_concurrency=16)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np

from tram.bench.datasets import BenchRequest, make_requests
from tram.bench.report import machine_info, machine_summary, write_json
from tram.bench.serve_metrics import (
    RequestResult,
    StreamParser,
    format_report,
    format_sweep_table,
    parse_goodput,
    parse_percentiles,
    summarize,
)

SWEEP_PARAMS = ("concurrency", "rate")
WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN = 16, 4


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The flags of `tram bench serve`."""
    p.add_argument(
        "--base-url",
        nargs="+",
        default=["http://127.0.0.1:8000"],
        help="server(s) to measure; several only make sense with --sweep or for a side-by-side run",
    )
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    p.add_argument(
        "--model",
        nargs="+",
        help="model name sent in requests (one, or one per --base-url); default: the first id of GET /v1/models",
    )
    p.add_argument("--label", nargs="+", help="name of each endpoint in results and plots (default: its url)")
    p.add_argument("--tokenizer", help="tokenizer path: vocabulary for random prompts, text for chat, --dataset-path")
    p.add_argument("--vocab-size", type=int, help="draw random prompt ids below this (instead of a tokenizer)")
    p.add_argument("--dataset-path", help="text file to cut prompts from (needs --tokenizer)")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", default="32:512", help="prompt length N or LO:HI")
    p.add_argument("--output-len", default="16:256", help="output length N or LO:HI")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf sends all at once")
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps: 1 = Poisson, <1 burstier, >1 more even",
    )
    p.add_argument("--max-concurrency", type=int, help="most requests in flight at once")
    p.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="METRIC:MS",
        help="SLOs such as ttft:500 tpot:50 e2el:2000; goodput counts requests meeting all of them",
    )
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--output-json", help="write the result (a list of results for a sweep) here")
    p.add_argument("--sweep", help="concurrency=1,16,64 or rate=1,4,16,inf: one run per value, and a plot")
    p.add_argument("--plot", default="sweep.png", help="PNG path of the sweep plot")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--warmup", type=int, default=2, help="small untimed requests sent first to each server")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one request")


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times, in seconds after the start, of `n` requests.

    The gaps are gamma-distributed with shape `burstiness` and mean 1/rate: shape 1 is a Poisson
    process, a smaller shape clusters requests into bursts, a larger one spaces them evenly. The first
    request goes at once. A seeded generator makes two servers see the same arrival pattern.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be positive")
    if math.isinf(rate) or n == 0:
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def is_chat(endpoint: str) -> bool:
    return endpoint.rstrip("/").endswith("chat/completions")


def build_payload(
    endpoint: str, model: str, req: BenchRequest, tokenizer: Any | None = None, extra_body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body of one streamed request that asks for exactly `req.output_len` tokens."""
    body: dict[str, Any] = {
        "model": model,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": req.output_len,
    }
    if is_chat(endpoint):
        # Chat takes text, so the ids go through the tokenizer; the server re-tokenizes them (plus
        # the chat template), which is why prompt counts come from the usage it reports.
        if tokenizer is None:
            raise ValueError("a chat endpoint needs --tokenizer to turn the prompt ids into text")
        body["messages"] = [{"role": "user", "content": tokenizer.decode(req.prompt_token_ids)}]
        body["max_completion_tokens"] = req.output_len  # the newer name; max_tokens for older servers
    else:
        body["prompt"] = list(req.prompt_token_ids)
    return {**body, **(extra_body or {})}


_ATTEMPTS = 3


async def send_request(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], prompt_len: int, run_start: float
) -> RequestResult:
    """POST one streamed request and time its chunks. Failures are recorded in the result, never raised."""
    for attempt in range(_ATTEMPTS):
        sent = time.perf_counter()
        parser = StreamParser(sent)
        try:
            await _stream_into(session, url, payload, parser)
            break
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            # A pooled keep-alive connection the server had already closed (llama.cpp's server closes
            # them after a few requests; the request fails on write or on the first read): nothing
            # came back, so send again. The pool may hand out another stale one, hence a few tries.
            if attempt + 1 < _ATTEMPTS and parser.nothing_received():
                continue
            parser.error = parser.error or f"{type(e).__name__}: {e}"[:300]
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            parser.error = parser.error or f"{type(e).__name__}: {e}"[:300]
            break
    result = parser.result(time.perf_counter(), prompt_len, payload.get("max_tokens", 0))
    result.start = sent - run_start
    return result


async def _stream_into(session: aiohttp.ClientSession, url: str, payload: dict[str, Any], parser: StreamParser) -> None:
    async with session.post(url, json=payload) as resp:
        if resp.status != 200:
            parser.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
        else:
            # Our own line splitting: aiohttp's readline refuses lines over its buffer limit,
            # and a chunk with logprobs can be long.
            pending = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    parser.feed(line, now)
            if pending:
                parser.feed(pending, time.perf_counter())


async def fetch_model_id(base_url: str, timeout: float = 30.0) -> str:
    """The first model the server lists at GET /v1/models."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.get(base_url.rstrip("/") + "/v1/models") as resp:
            resp.raise_for_status()
            data = await resp.json(content_type=None)
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]


async def _warmup(session: aiohttp.ClientSession, url: str, payloads: list[dict[str, Any]], count: int) -> None:
    """A few short requests so that first-call costs (connections, compilation) stay out of the timing."""
    warm = []
    for i in range(count):
        body = dict(payloads[i % len(payloads)])
        if isinstance(body.get("prompt"), list):
            body["prompt"] = body["prompt"][:WARMUP_PROMPT_LEN]
        body["max_tokens"] = WARMUP_OUTPUT_LEN
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = WARMUP_OUTPUT_LEN
        warm.append(body)
    results = await asyncio.gather(*(send_request(session, url, b, 1, time.perf_counter()) for b in warm))
    failed = [r.error for r in results if not r.success]
    if failed:
        print(f"warning: {len(failed)}/{count} warmup requests to {url} failed: {failed[0]}", file=sys.stderr)


async def _run_requests(
    session: aiohttp.ClientSession,
    url: str,
    payloads: list[dict[str, Any]],
    prompt_lens: list[int],
    offsets: list[float],
    max_concurrency: int | None,
    progress: Any | None,
) -> tuple[list[RequestResult], float]:
    """Send every request at its arrival time (then waiting for a free slot under the cap)."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(i: int) -> RequestResult:
        delay = start + offsets[i] - time.perf_counter()  # absolute schedule: sleeps do not drift
        if delay > 0:
            await asyncio.sleep(delay)
        if limit is None:
            result = await send_request(session, url, payloads[i], prompt_lens[i], start)
        else:
            async with limit:
                result = await send_request(session, url, payloads[i], prompt_lens[i], start)
        if progress is not None:
            progress.update(1)
        return result

    results = await asyncio.gather(*(one(i) for i in range(len(payloads))))
    return list(results), time.perf_counter() - start


async def benchmark(
    base_url: str,
    model: str,
    requests: Sequence[BenchRequest],
    *,
    endpoint: str = "/v1/completions",
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
    slos_ms: dict[str, float] | None = None,
    tokenizer: Any | None = None,
    seed: int = 0,
    timeout: float = 600.0,
    warmup: int = 2,
    disable_tqdm: bool = True,
    label: str | None = None,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `requests` against one server and return the result dict (see `serve_metrics.summarize`)."""
    url = base_url.rstrip("/") + endpoint
    payloads = [build_payload(endpoint, model, r, tokenizer, extra_body) for r in requests]
    offsets = arrival_offsets(len(requests), request_rate, burstiness, seed)
    # aiohttp caps a session at 100 connections by default, which would silently cap concurrency.
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, limit_per_host=max_concurrency or 0)
    progress = None
    if not disable_tqdm:
        from tqdm import tqdm

        progress = tqdm(total=len(payloads), desc=label or base_url, unit="req")
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            if warmup > 0 and payloads:
                await _warmup(s, url, payloads, warmup)
            results, duration = await _run_requests(
                s, url, payloads, [r.prompt_len for r in requests], offsets, max_concurrency, progress
            )
    finally:
        if progress is not None:
            progress.close()
    out = {
        "label": label or base_url,
        "base_url": base_url,
        "endpoint": endpoint,
        "model": model,
        "num_prompts": len(requests),
        "request_rate": request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        # The client's machine: usually the server's too, and always the one whose clock timed it.
        "machine": machine_info(),
    }
    out.update(summarize(results, duration, percentiles, slos_ms))
    return out


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """'concurrency=1,16,64' -> ('concurrency', [1, 16, 64]); 'rate=1,inf' -> ('rate', [1.0, inf])."""
    name, _, values = text.partition("=")
    try:
        parsed = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        parsed = []
    if name not in SWEEP_PARAMS or not parsed or any(v <= 0 for v in parsed):
        raise ValueError(f"bad --sweep {text!r}: expected concurrency=N,N,... or rate=R,R,...,inf")
    if name == "concurrency":
        if any(math.isinf(v) or not v.is_integer() for v in parsed):
            raise ValueError(f"bad --sweep {text!r}: concurrency values are whole numbers")
        return name, [int(v) for v in parsed]
    return name, parsed


def _per_endpoint(values: list[str], n: int, flag: str) -> list[str | None]:
    """One value for every endpoint: none given, one shared by all, or one each."""
    if not values:
        return [None] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"{flag} takes one value or one per --base-url ({n})")
    return list(values)


def _as_list(value: str | list[str] | None) -> list[str]:
    """Flags given as one string (a hand-made Namespace) or a list (argparse nargs="+")."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer  # slow to import; only when asked for

    return AutoTokenizer.from_pretrained(path)


async def run_serve_async(args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    """`tram bench serve` without the event loop: one run per (endpoint, sweep value)."""
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    requests = make_requests(
        args.num_prompts,
        args.input_len,
        args.output_len,
        args.seed,
        tokenizer=tokenizer,
        vocab_size=args.vocab_size,
        dataset_path=args.dataset_path,
    )
    urls = _as_list(args.base_url) or ["http://127.0.0.1:8000"]
    models = _per_endpoint(_as_list(args.model), len(urls), "--model")
    labels = _per_endpoint(_as_list(args.label), len(urls), "--label")
    if len(urls) > 1 and len(set(labels)) < len(urls):  # one shared label would merge the plot lines
        labels = [f"{lab} ({u})" if lab else u for lab, u in zip(labels, urls)]
    percentiles, slos = parse_percentiles(args.percentiles), parse_goodput(args.goodput or [])
    param, values = parse_sweep(args.sweep) if args.sweep else ("", [None])
    print(f"client {machine_summary()}", flush=True)
    runs = []
    for url, model, label in zip(urls, models, labels):
        model = model or await fetch_model_id(url)
        for k, value in enumerate(values):
            rate = value if param == "rate" else args.request_rate
            concurrency = value if param == "concurrency" else args.max_concurrency
            result = await benchmark(
                url,
                model,
                requests,
                endpoint=args.endpoint,
                request_rate=rate,
                burstiness=args.burstiness,
                max_concurrency=concurrency,
                percentiles=percentiles,
                slos_ms=slos,
                tokenizer=tokenizer,
                seed=args.seed,
                timeout=args.timeout,
                warmup=args.warmup if k == 0 else 0,
                disable_tqdm=args.disable_tqdm,
                label=label or url,
            )
            if param:
                result["sweep"] = {"param": param, "value": value}
            print(format_report(result), flush=True)
            runs.append(result)
    if param:
        from tram.bench.sweep_plot import plot_sweep

        print(format_sweep_table(runs))
        plot_sweep(runs, args.plot)
        print(f"sweep plot written to {args.plot}")
    out: dict[str, Any] | list[dict[str, Any]] = runs if param or len(runs) > 1 else runs[0]
    if args.output_json:
        write_json(args.output_json, out)
    return out


def run_serve(args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    """Entry point of `tram bench serve`: runs, prints the report table(s), returns the result(s)."""
    return asyncio.run(run_serve_async(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tram bench serve", description=__doc__.split("\n\n")[0])
    add_serve_args(parser)
    run_serve(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
