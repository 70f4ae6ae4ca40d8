"""Load a running OpenAI-compatible server with concurrent streaming completions; report throughput
and latency. Works against any such server (Tram, vLLM, llama.cpp's server), so peers can be compared
on the same workload.

    python benchmarks/serve_streams.py --url http://127.0.0.1:8000 --concurrency 64 --num-requests 256
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp


async def one_request(session: aiohttp.ClientSession, url: str, model: str | None, prompt: str, output_len: int) -> dict:
    body = {"prompt": prompt, "max_tokens": output_len, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    start = time.perf_counter()
    ttft, last, itls, tokens = None, start, [], 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:  # one SSE line at a time
            if not raw.startswith(b"data: {"):
                continue
            chunk = json.loads(raw[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not chunk["choices"]:
                continue
            if ttft is None:
                ttft = now - start
            else:
                itls.append(now - last)
            last = now
    return {"ttft": ttft, "e2e": time.perf_counter() - start, "tokens": tokens, "itls": itls}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def run(args: argparse.Namespace) -> dict:
    sem = asyncio.Semaphore(args.concurrency)
    prompts = [f"{args.prompt} {i}" for i in range(args.num_requests)]
    # aiohttp rather than httpx: at 64 streams httpx's own overhead on a small machine added seconds
    # to the measured time to first token (see docs/benchmarks.md).
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def bounded(p: str) -> dict:
            async with sem:
                return await one_request(session, args.url, args.model, p, args.output_len)

        start = time.perf_counter()
        results = await asyncio.gather(*[bounded(p) for p in prompts])
        elapsed = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    itls = [x for r in results for x in r["itls"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(results), "concurrency": args.concurrency, "duration_s": round(elapsed, 2),
        "output_tokens": tokens, "output_tok_per_s": round(tokens / elapsed, 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1), "ttft_p99_ms": round(1000 * percentile(ttfts, 99), 1),
        "itl_p50_ms": round(1000 * statistics.median(itls), 2) if itls else None,
        "itl_p99_ms": round(1000 * percentile(itls, 99), 2) if itls else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompt", default="Once upon a time, in a small village,")
    return p.parse_args(argv)


def main() -> None:
    print(json.dumps(asyncio.run(run(parse_args())), indent=2))


if __name__ == "__main__":
    main()
