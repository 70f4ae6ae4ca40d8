"""A burst of slow-to-compile JSON schemas against a real `tram serve` (issue 35, defect 1): twenty
concurrent requests, each with a distinct schema that xgrammar takes ~14 s to compile alone (nested
`oneOf` of depth 8; the issue's other shape, object chains 300-450 deep, is refused up front now as
nested past 256 levels), while another client sends plain completions. Run it from a checkout to
measure that checkout's server:

    python3 benchmarks/grammar_burst.py                      # the issue's 30 s compile limit
    python3 benchmarks/grammar_burst.py --compile-timeout 5  # the same burst, sooner over
    python3 benchmarks/grammar_burst.py --rounds 3           # memory must not grow burst after burst

Printed: the burst's statuses and seconds; the plain requests' p50 / p99 / max during it; how long a
trivial schema takes right after it (and its status); the engine's CPU use in the seconds after (a
compile left running burns it); the engine's resident memory (with any processes it started) before
the burst and after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _checkout  # noqa: F401 - this checkout's tram first
import httpx

from tram.bench.report import machine_summary
from tram.bench.server_process import TramServer, child_pids

STORIES = str(_checkout.ROOT.parent / "shared" / "models" / "stories260K")
PROMPT = "Once upon a time"
CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


def nested_one_of(depth: int, tag: str) -> dict[str, Any]:
    """A oneOf of an object and an array, nested: its text grows as 3**depth (xgrammar: ~1.4 s at
    depth 7, ~14 s at 8 on stories260K's vocabulary). `tag` makes each one a distinct schema."""
    x: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        x = {"oneOf": [{"type": "object", "properties": {f"a{tag}": x, f"b{tag}": x}}, {"type": "array", "items": x}]}
    return x


def burst_schemas(n: int, run: str) -> list[dict[str, Any]]:
    """`n` distinct slow schemas (their property names differ, so no two share a compile)."""
    return [nested_one_of(8, f"{run}_{i}_") for i in range(n)]


def completion_body(schema: dict[str, Any]) -> bytes:
    body = {"model": STORIES, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "guided_json": schema}
    return json.dumps(body).encode()


def constrained(url: str, body: bytes, timeout: float = 600) -> tuple[int, float, str]:
    """A completion under the schema in `body`: its status, seconds and (for an error) the message's start."""
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=timeout) as c:
        resp = c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - start
    message = "" if resp.status_code == 200 else resp.json().get("error", {}).get("message", "")[:90]
    return resp.status_code, elapsed, message


def plain_loop(url: str, stop: Any, out: Any) -> None:
    """Short plain completions one after another (20 ms apart) until `stop`; their latencies go to
    `out`. A process of its own: in the burst's process, the burst's threads would hold the GIL
    while this one waits to time its requests."""
    latencies: list[float] = []
    body = {"model": STORIES, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    with httpx.Client(base_url=url, timeout=600) as c:
        while not stop.is_set():
            start = time.perf_counter()
            c.post("/v1/completions", json=body).raise_for_status()
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
    out.send(latencies)


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(child_pids(p))
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its descendants (compile processes count against the engine)."""
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid`, with the children it has reaped and those still alive."""
    total = 0.0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_burst(url: str, n: int, run: str) -> tuple[list[tuple[int, float, str]], list[float]]:
    """The burst with the plain loop beside it: each burst request's outcome, the plain latencies.
    The bodies are built and encoded first, so the burst's start costs this process nothing."""
    bodies = [completion_body(schema) for schema in burst_schemas(n, run)]
    ctx = multiprocessing.get_context("spawn")
    stop, (receive, send) = ctx.Event(), ctx.Pipe(duplex=False)
    plain = ctx.Process(target=plain_loop, args=(url, stop, send))
    plain.start()
    time.sleep(2.0)  # the loop's process has started and sends requests
    with ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(lambda body: constrained(url, body), bodies))
    stop.set()
    latencies = receive.recv()
    plain.join()
    return outcomes, latencies


def report_burst(outcomes: list[tuple[int, float, str]], latencies: list[float]) -> None:
    statuses: dict[int, int] = {}
    for status, _, _ in outcomes:
        statuses[status] = statuses.get(status, 0) + 1
    seconds = [s for _, s, _ in outcomes]
    print(f"burst: {len(outcomes)} requests, statuses {statuses}, seconds {min(seconds):.1f} to {max(seconds):.1f}")
    print(f"  first error: {next((m for st, _, m in outcomes if st != 200), '-')}")
    print(
        f"plain requests during the burst: {len(latencies)}, p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {pct(latencies, 0.99) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )


def one_round(url: str, engine: int, schemas: int, run: str, after: float) -> None:
    """A burst, a trivial schema right after it, and the engine's CPU use in the seconds after."""
    outcomes, latencies = run_burst(url, schemas, run)
    report_burst(outcomes, latencies)
    trivial = {"type": "object", "properties": {f"t{run}": {"type": "integer"}}, "required": [f"t{run}"]}
    status, seconds, message = constrained(url, completion_body(trivial))
    print(f"trivial schema after the burst: {status} in {seconds:.2f} s {message}")
    cpu0, t0 = cpu_seconds(engine), time.perf_counter()
    time.sleep(after)
    busy = (cpu_seconds(engine) - cpu0) / (time.perf_counter() - t0)
    print(f"engine CPU in the {after:.0f} s after: {busy * 100:.0f}% of a core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=STORIES)
    parser.add_argument("--compile-timeout", type=float, default=30.0)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--after", type=float, default=10.0, help="seconds watched after the burst")
    parser.add_argument("--rounds", type=int, default=1, help="bursts one after another (memory must not grow)")
    args = parser.parse_args()
    print(machine_summary())
    server = TramServer(args.model, ["--structured-outputs-compile-timeout", str(args.compile_timeout)], timeout=300)
    run = str(int(time.time()) % 100_000)
    try:
        engine = server.engine_core_pid()
        constrained(server.url, completion_body({"type": "object", "properties": {"warm": {"type": "integer"}}}))
        before = rss_mb(engine)
        for i in range(args.rounds):
            one_round(server.url, engine, args.schemas, f"{run}r{i}", args.after)
            print(f"engine RSS (with its processes): before {before:.0f} MB, after {rss_mb(engine):.0f} MB")
    finally:
        server.stop(strict=False)


if __name__ == "__main__":
    main()
