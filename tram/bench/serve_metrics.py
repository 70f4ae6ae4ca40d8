"""The arithmetic of `tram bench serve`, kept free of I/O so that it is unit-tested on synthetic data.

`StreamParser` turns the SSE lines of one streamed completion into a `RequestResult`; `summarize`
turns the results of a run into the result dict (vLLM's `benchmark_serving` keys, times in ms);
`format_report` renders that dict as the familiar text table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tram.bench.timing import percentile_name, stats_ms

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestResult:
    """One request as the client saw it. Times are in seconds, measured from the moment it was sent."""

    success: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    # True when the server sent no usage and output_tokens is the count of token-carrying chunks.
    output_tokens_estimated: bool = False
    requested_output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start: float = 0.0  # when it was sent, seconds after the run began (for the concurrency count)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; undefined for failures and one-token outputs."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def choice_has_token(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice stands for generated token(s).

    A chunk with text obviously does. A mid-stream chunk with empty text does too: Tram sends one when
    a token's bytes are held back as incomplete UTF-8. A closing chunk with empty text and a
    finish_reason (llama.cpp's last chunk) and a chat delta that only announces the role do not.
    """
    delta = choice.get("delta")
    if isinstance(delta, dict):  # chat completions
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
        if "role" in delta or delta.get("content") is None:
            return False
        return choice.get("finish_reason") is None
    if choice.get("text") or choice.get("token_ids"):
        return True
    return choice.get("text") is not None and choice.get("finish_reason") is None


class StreamParser:
    """Accumulates the SSE lines of one response; `result()` gives its `RequestResult`."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.itl: list[float] = []
        self.token_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.error = ""
        self.done = False

    def feed(self, line: str | bytes, now: float) -> None:
        """One line of the event stream, received at `now` (same clock as `sent_at`)."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip()
        if not line.startswith("data:"):
            return  # blank separators, ": keep-alive" comments, "event:" lines
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = self.error or f"unparsable SSE data: {data[:200]}"
            return
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            self.error = self.error or f"error in stream: {json.dumps(chunk['error'])[:300]}"
            return
        # llama.cpp may put usage in its last content chunk instead of a `choices: []` chunk.
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if any(isinstance(c, dict) and choice_has_token(c) for c in chunk.get("choices") or []):
            if self.first_token_at is None:
                self.first_token_at = now
            else:
                self.itl.append(now - self.last_token_at)
            self.last_token_at = now
            self.token_chunks += 1

    def nothing_received(self) -> bool:
        return self.first_token_at is None and self.usage is None and not self.done and not self.error

    def result(self, end: float, sent_prompt_len: int, requested_output_tokens: int) -> RequestResult:
        r = RequestResult(
            requested_output_tokens=requested_output_tokens, latency=end - self.sent_at, prompt_tokens=sent_prompt_len
        )
        if self.error:
            r.error = self.error
            return r
        if self.first_token_at is None:
            r.error = "the stream ended without any token"
            return r
        r.success, r.ttft, r.itl = True, self.first_token_at - self.sent_at, self.itl
        usage = self.usage or {}
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            r.output_tokens = completion
        else:
            r.output_tokens, r.output_tokens_estimated = self.token_chunks, True
        if isinstance(usage.get("prompt_tokens"), int):
            r.prompt_tokens = usage["prompt_tokens"]
        return r


def parse_percentiles(text: str) -> list[float]:
    """'50,90,99' -> [50.0, 90.0, 99.0]."""
    values = [float(p) for p in text.split(",") if p.strip()]
    if not values or any(not 0 <= p <= 100 for p in values):
        raise ValueError(f"bad percentiles {text!r}: expected comma-separated numbers in [0, 100]")
    return values


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """['ttft:500', 'e2el:2000'] -> {'ttft': 500.0, 'e2el': 2000.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if name not in SLO_METRICS or ms <= 0:
            raise ValueError(f"bad goodput SLO {item!r}: expected NAME:MS with NAME in {SLO_METRICS} and MS > 0")
        slos[name] = ms
    return slos


def is_good(r: RequestResult, slos_ms: dict[str, float]) -> bool:
    """A request is good when it succeeded and meets every SLO (a value equal to the SLO meets it)."""
    if not r.success:
        return False
    # A one-token output has no per-token time, so it cannot miss a TPOT SLO.
    values = {"ttft": r.ttft * 1000, "tpot": (r.tpot or 0.0) * 1000, "e2el": r.latency * 1000}
    return all(values[name] <= limit for name, limit in slos_ms.items())


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Most intervals open at once. An interval ending when another starts does not overlap it."""
    spans = list(intervals)  # may be a generator; it is read twice
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = live = 0
    for _, delta in events:  # at equal times -1 sorts first: ends are counted before starts
        live += delta
        peak = max(peak, live)
    return peak


def summarize(
    results: Sequence[RequestResult],
    duration: float,
    percentiles: Sequence[float] = (50, 90, 99),
    slos_ms: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The result dict of one run: counts, throughputs, latency statistics (ms) and per-request lists."""
    ok = [r for r in results if r.success]
    total_in, total_out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    per_s = 1.0 / duration if duration > 0 else 0.0
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) * per_s,
        "output_throughput": total_out * per_s,
        "total_token_throughput": (total_in + total_out) * per_s,
        "max_concurrency_observed": peak_concurrency((r.start, r.start + r.latency) for r in results),
        "estimated_output_token_requests": sum(r.output_tokens_estimated for r in ok),
        # A server that stops early (no ignore_eos) makes a comparison unfair; this shows it.
        "output_len_mismatches": sum(r.output_tokens != r.requested_output_tokens for r in ok),
        "percentiles": list(percentiles),
    }
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    for metric, values in series.items():
        for stat, value in stats_ms(values, percentiles).items():
            out[f"{stat}_{metric}_ms"] = value
    if slos_ms:
        good = sum(is_good(r, slos_ms) for r in results)
        out.update(goodput_slos_ms=dict(slos_ms), good_requests=good, request_goodput=good * per_s)
    out.update(
        input_lens=[r.prompt_tokens for r in results],
        output_lens=[r.output_tokens for r in results],
        ttfts_ms=[r.ttft * 1000 if r.success else None for r in results],
        e2els_ms=[r.latency * 1000 for r in results],
        errors=[r.error for r in results if r.error],
    )
    return out


_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def value_text(v: Any) -> str:
    """20.0 -> '20', inf -> 'inf', None -> 'None': sweep values and rates read as typed."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _row(name: str, value: Any) -> str:
    if value is None:
        return f"{name:<40} {'n/a':<10}"
    return f"{name:<40} {value:<10.2f}" if isinstance(value, float) else f"{name:<40} {value:<10}"


def format_report(s: dict[str, Any]) -> str:
    """The vLLM-style text table of one result dict."""
    lines = [f"{' Serving Benchmark Result ':=^50}"]
    if s.get("label"):
        lines.append(_row("Endpoint:", s["label"]))
    if "request_rate" in s:
        lines.append(_row("Request rate (req/s):", value_text(s["request_rate"])))
        lines.append(_row("Max concurrency:", value_text(s.get("max_concurrency"))))
    if s.get("goodput_slos_ms"):
        slos = " ".join(f"{k}:{value_text(v)}" for k, v in s["goodput_slos_ms"].items())
        lines.append(_row("Goodput SLOs (ms):", slos))
    lines += [
        _row("Successful requests:", s["completed"]),
        _row("Failed requests:", s["failed"]),
        _row("Benchmark duration (s):", float(s["duration"])),
        _row("Total input tokens:", s["total_input_tokens"]),
        _row("Total generated tokens:", s["total_output_tokens"]),
        _row("Request throughput (req/s):", float(s["request_throughput"])),
    ]
    if "request_goodput" in s:
        lines.append(_row("Request goodput (req/s):", float(s["request_goodput"])))
    lines += [
        _row("Output token throughput (tok/s):", float(s["output_throughput"])),
        _row("Total Token throughput (tok/s):", float(s["total_token_throughput"])),
        _row("Max concurrency observed:", s["max_concurrency_observed"]),
    ]
    if s["estimated_output_token_requests"]:
        lines.append(_row("Output counts estimated (no usage):", s["estimated_output_token_requests"]))
    if s["output_len_mismatches"]:
        lines.append(_row("Outputs not of the requested length:", s["output_len_mismatches"]))
    for metric, title, short in _SECTIONS:
        lines.append(f"{title:-^50}")
        lines.append(_row(f"Mean {short} (ms):", s[f"mean_{metric}_ms"]))
        lines.append(_row(f"Median {short} (ms):", s[f"median_{metric}_ms"]))
        for p in s["percentiles"]:
            name = percentile_name(p)
            lines.append(_row(f"P{name[1:]} {short} (ms):", s[f"{name}_{metric}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)


def format_sweep_table(runs: Sequence[dict[str, Any]]) -> str:
    """One line per (endpoint, sweep value): the numbers the sweep plot draws."""
    p = percentile_name(max(runs[0]["percentiles"])) if runs else "p99"
    head = (
        f"{'endpoint':<28} {'value':>8} {'ok':>5} {'fail':>5} {'req/s':>8} {'out tok/s':>10} "
        f"{p + ' TTFT':>10} {p + ' ITL':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        ttft, itl = r.get(f"{p}_ttft_ms"), r.get(f"{p}_itl_ms")
        lines.append(
            f"{str(r.get('label'))[:28]:<28} {value_text(r.get('sweep', {}).get('value')):>8} {r['completed']:>5} "
            f"{r['failed']:>5} {r['request_throughput']:>8.2f} {r['output_throughput']:>10.1f} "
            f"{'n/a' if ttft is None else f'{ttft:.1f}':>10} {'n/a' if itl is None else f'{itl:.2f}':>9}"
        )
    return "\n".join(lines)
