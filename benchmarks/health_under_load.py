"""How long /health takes to answer while one heavy request is being served: the event-loop stalls
that issue 13 measured (a long prompt being tokenized, 10,000 prompts in one request, a body far over
the context). Run it from a checkout to measure that checkout's server:

    python3 benchmarks/health_under_load.py                 # this checkout
    git worktree add /tmp/before 90859c0  # then copy this script there and run it from /tmp/before

Another client polls /health every 10 ms on its own connection while the heavy request runs; reported
are the heavy request's status and seconds, and the polls' count, median and maximum latency.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import _checkout  # noqa: F401 - this checkout's tram first
import httpx

from tram.bench.report import machine_summary
from tram.bench.server_process import TramServer

STORIES = str(_checkout.ROOT.parent / "shared" / "models" / "stories260K")


def _during(url: str, work: Callable[[httpx.Client], httpx.Response]) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            c.get("/health")
            while not done.is_set():
                start = time.perf_counter()
                c.get("/health")
                latencies.append(time.perf_counter() - start)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.2)
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600) as c:
        status = work(c).status_code
    elapsed = time.perf_counter() - start
    done.set()
    poller.join()
    return status, elapsed, latencies


WORKLOADS: dict[str, Callable[[httpx.Client], httpx.Response]] = {
    "1.8 MB prompt, tokenized whole": lambda c: c.post(
        "/v1/completions",
        json={"prompt": "Once upon a time, there was a girl. " * 50_000, "max_tokens": 1, "truncate_prompt_tokens": 50},
    ),
    "10,000 token-id prompts": lambda c: c.post(
        "/v1/completions", json={"prompt": [[5, 6, 7, 8 + i % 100] for i in range(10_000)], "max_tokens": 1}
    ),
    "2 MB prompt over the context": lambda c: c.post("/v1/completions", json={"prompt": "a " * 1_000_000}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=STORIES)
    args = parser.parse_args()
    print(machine_summary())
    server = TramServer(args.model, timeout=300)
    try:
        print(f"{'workload':34} {'status':>6} {'seconds':>8} {'polls':>6} {'p50 ms':>7} {'max ms':>7}")
        for name, work in WORKLOADS.items():
            status, elapsed, lat = _during(server.url, work)
            p50 = statistics.median(lat) * 1000 if lat else float("nan")
            worst = max(lat) * 1000 if lat else float("nan")
            print(f"{name:34} {status:>6} {elapsed:>8.2f} {len(lat):>6} {p50:>7.1f} {worst:>7.1f}")
    finally:
        server.stop(strict=False)


if __name__ == "__main__":
    main()
