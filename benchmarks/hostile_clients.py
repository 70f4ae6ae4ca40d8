"""Two kinds of hostile client against a real `tram serve` (issue 35): a huge prompt sent to /tokenize
(defect 3: three 14.7 MB calls once held a plain completion for 30 s) and connections that send half a
request's headers and then nothing (defect 8: uvicorn waited for the rest without limit). Run it from
a checkout to measure that checkout's server (TRAM_CPU_KERNELS=0 skips the C++ kernels' build, which
a fresh worktree would otherwise start with):

    TRAM_CPU_KERNELS=0 python3 benchmarks/hostile_clients.py --json after.json
    TRAM_CPU_KERNELS=0 python3 benchmarks/hostile_clients.py --connections 50 --tokenize-mb 1  # a quick check
    git worktree add /tmp/before 145c0fd  # copy this script there, run it from /tmp/before with --model

Printed (and written with --json): for /tokenize, one huge request's status and seconds, then three
back to back with a plain completion every 20 ms beside them (its p50 / p99 / max and failures), and
the API server process's resident memory before, at its peak and after; for the half-open
connections, the plain completions' latency while they are held, and how many of them the server
closed before the deadline, how many of those with a 408, and after how long. Every HTTP call has a
client timeout (120 s): a server that stalls shows as timeouts, not as a benchmark that hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import _checkout
import httpx

from tram.bench.report import machine_info, machine_summary, write_json
from tram.bench.server_process import TramServer

STORIES = str(_checkout.ROOT.parent / "shared" / "models" / "stories260K")
PROMPT = "Once upon a time"
TIMEOUT = 120.0  # seconds, every HTTP call
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"  # and never the blank line that ends it


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def latency_stats(latencies: list[float], failures: list[str]) -> dict[str, Any]:
    """Count, p50 / p99 / max in ms, and the failures (timeouts, errors, statuses other than 200)."""
    ms = [x * 1000 for x in latencies]
    return {
        "requests": len(ms) + len(failures),
        "ok": len(ms),
        "p50_ms": statistics.median(ms) if ms else float("nan"),
        "p99_ms": pct(ms, 0.99),
        "max_ms": max(ms, default=float("nan")),
        "failures": len(failures),
        "failure_kinds": sorted(set(failures)),
    }


def plain_loop(url: str, model: str, stop: threading.Event, latencies: list[float], failures: list[str]) -> None:
    """Short greedy completions one after another (20 ms apart) until `stop`."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                resp = c.post("/v1/completions", json=body)
            except httpx.TimeoutException:
                failures.append(f"timeout after {TIMEOUT:g} s")
            except httpx.HTTPError as e:
                failures.append(type(e).__name__)
            else:
                if resp.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures.append(f"status {resp.status_code}")
            time.sleep(0.02)


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` alone, in MB (nan once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return float("nan")


def tokenize(url: str, body: bytes) -> dict[str, Any]:
    """One POST /tokenize: its status (or "timeout"), seconds, and the token count or error's start."""
    start = time.perf_counter()
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
            resp = c.post("/tokenize", content=body, headers={"content-type": "application/json"})
    except httpx.HTTPError as e:  # a timeout is one: the server did not answer in TIMEOUT seconds
        kind = "timeout" if isinstance(e, httpx.TimeoutException) else type(e).__name__
        return {"status": kind, "seconds": time.perf_counter() - start, "detail": str(e)[:90] or kind}
    seconds = time.perf_counter() - start
    try:
        answer = resp.json()
        detail = f"{answer['count']} tokens" if resp.status_code == 200 else answer["error"]["message"][:90]
    except (ValueError, KeyError, TypeError):
        detail = resp.text[:90]
    return {"status": resp.status_code, "seconds": seconds, "detail": detail}


def with_plain_loop(url: str, model: str, work: threading.Thread) -> dict[str, Any]:
    """Run `work` with the plain loop beside it (from 0.2 s before it until it ends): the loop's stats."""
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()
    plain = threading.Thread(target=plain_loop, args=(url, model, stop, latencies, failures))
    plain.start()
    time.sleep(0.2)
    work.start()
    work.join()
    stop.set()
    plain.join()
    return latency_stats(latencies, failures)


def measure_tokenize(server: TramServer, model: str, mb: float) -> dict[str, Any]:
    """One huge /tokenize, then three back to back beside the plain loop; the API server's RSS."""
    prompt = "hello world " * int(mb * 1e6 / 12)
    body = json.dumps({"model": model, "prompt": prompt}).encode()
    pid = server.proc.pid
    rss: dict[str, float] = {"before": rss_mb(pid)}
    peak = [rss["before"]]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak.append(rss_mb(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    single = tokenize(server.url, body)
    runs: list[dict[str, Any]] = []
    three = threading.Thread(target=lambda: runs.extend(tokenize(server.url, body) for _ in range(3)))
    plain = with_plain_loop(server.url, model, three)
    done.set()
    sampler.join()
    rss.update(peak=max(peak), after=rss_mb(pid))
    out = {"prompt_bytes": len(prompt), "body_bytes": len(body), "single": single, "back_to_back": runs}
    return {**out, "plain_during": plain, "api_server_rss_mb": rss}


def open_half_requests(port: int, n: int) -> tuple[list[socket.socket], list[float], list[str]]:
    """`n` connections that each send a request's first header lines and nothing more."""
    socks, opened, errors = [], [], []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(PARTIAL_HEAD)
        except OSError as e:
            errors.append(type(e).__name__)
            continue
        s.setblocking(False)
        socks.append(s)
        opened.append(time.perf_counter())
    return socks, opened, errors


def watch_closes(socks: list[socket.socket], deadline: float, out: list[tuple[float | None, bytes]]) -> None:
    """Read every socket until EOF (or a reset) or `deadline`: when each closed (None: still open) and
    what it received, into `out`."""
    got = {s: b"" for s in socks}
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while len(closed) < len(socks) and (left := deadline - time.perf_counter()) > 0:
            for key, _ in sel.select(timeout=min(left, 0.5)):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""  # a reset closes it as well
                if data:
                    got[s] += data
                else:
                    closed[s] = time.perf_counter()
                    sel.unregister(s)
    out.extend((closed.get(s), got[s]) for s in socks)


def measure_connections(server: TramServer, model: str, n: int, hold: float, deadline: float) -> dict[str, Any]:
    """Hold `n` half-sent requests, run the plain loop for `hold` seconds, then count the closes."""
    socks, opened, errors = open_half_requests(server.port, n)
    end = time.perf_counter() + deadline  # `deadline` seconds after the last one opened
    outcomes: list[tuple[float | None, bytes]] = []
    watcher = threading.Thread(target=watch_closes, args=(socks, end, outcomes))
    watcher.start()
    plain = with_plain_loop(server.url, model, threading.Thread(target=time.sleep, args=(hold,)))
    watcher.join()
    for s in socks:
        s.close()
    after = [t - t0 for (t, _), t0 in zip(outcomes, opened) if t is not None]
    answers = [data for t, data in outcomes if t is not None]
    return {
        "requested": n,
        "opened": len(socks),
        "open_errors": sorted(set(errors)),
        "plain_during": plain,
        "deadline_s": deadline,
        "closed": len(after),
        "closed_with_408": sum(d.startswith(b"HTTP/1.1 408") for d in answers),
        "closed_silently": sum(not d for d in answers),
        "still_open": len(socks) - len(after),
        "close_after_s": [min(after), statistics.median(after), max(after)] if after else None,
    }


def fmt_stats(s: dict[str, Any]) -> str:
    kinds = f" ({', '.join(s['failure_kinds'])})" if s["failure_kinds"] else ""
    return (
        f"{s['ok']} ok, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, max {s['max_ms']:.0f} ms; "
        f"failures {s['failures']}{kinds}"
    )


def fmt_call(r: dict[str, Any]) -> str:
    return f"{r['status']} in {r['seconds']:.2f} s ({r['detail'][:70]})"


def row(label: str, text: str) -> None:
    print(f"  {label:<24}{text}")


def print_tokenize(t: dict[str, Any]) -> None:
    print(f"/tokenize, a {t['prompt_bytes'] / 1e6:.1f} MB prompt (body {t['body_bytes'] / 1e6:.1f} MB)")
    row("one request", fmt_call(t["single"]))
    for i, r in enumerate(t["back_to_back"], 1):
        row(f"back to back #{i}", fmt_call(r))
    row("plain during the three", fmt_stats(t["plain_during"]))
    m = t["api_server_rss_mb"]
    row("API server RSS", f"before {m['before']:.0f} MB, peak {m['peak']:.0f} MB, after {m['after']:.0f} MB")


def print_connections(c: dict[str, Any], nofile: tuple[int, int]) -> None:
    errors = f" ({', '.join(c['open_errors'])})" if c["open_errors"] else ""
    print(f"half-open connections: {c['opened']} of {c['requested']} opened{errors}; client nofile {nofile}")
    row("plain while held", fmt_stats(c["plain_during"]))
    closed = f"{c['closed']} of {c['opened']}, with a 408: {c['closed_with_408']}, with nothing: {c['closed_silently']}"
    row(f"closed within {c['deadline_s']:g} s", f"{closed}; still open: {c['still_open']}")
    if c["close_after_s"]:
        lo, mid, hi = c["close_after_s"]
        row("closed after", f"min {lo:.1f} s, median {mid:.1f} s, max {hi:.1f} s")


def raise_nofile() -> tuple[int, int]:
    """The soft open-file limit raised to the hard one (the client must not be what runs out)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=STORIES)
    parser.add_argument("--tokenize-mb", type=float, default=14.7, help="the /tokenize prompt's size (1 MB = 1e6)")
    parser.add_argument("--connections", type=int, default=500, help="half-open connections held")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds of plain requests while they are held")
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds after opening to watch for closes")
    parser.add_argument("--skip-tokenize", action="store_true")
    parser.add_argument("--skip-connections", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    nofile = raise_nofile()
    print(machine_summary())
    server = TramServer(args.model, timeout=300)
    try:
        cwd = os.readlink(f"/proc/{server.proc.pid}/cwd")
        print(f"server: pid {server.proc.pid}, running in {cwd}")
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:  # warm up
            c.post("/v1/completions", json={"model": args.model, "prompt": PROMPT, "max_tokens": 8}).raise_for_status()
        report: dict[str, Any] = {"machine": machine_info(), "server_cwd": cwd, "client_nofile": nofile}
        if not args.skip_tokenize:
            report["tokenize"] = measure_tokenize(server, args.model, args.tokenize_mb)
            print_tokenize(report["tokenize"])
        if not args.skip_connections:
            report["connections"] = measure_connections(server, args.model, args.connections, args.hold, args.deadline)
            print_connections(report["connections"], nofile)
    finally:
        server.stop(strict=False)
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
