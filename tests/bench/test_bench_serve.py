"""`tram bench serve`: the metrics arithmetic on hand-computed data, the SSE parser on synthetic lines,
and the client end to end against an in-process fake OpenAI server (known delays, chunk counts and
failures) and, once, against a real `tram serve`."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from tram.bench.datasets import BenchRequest
from tram.bench.report import json_safe
from tram.bench.serve import (
    add_serve_args,
    arrival_offsets,
    benchmark,
    build_payload,
    parse_sweep,
    run_serve_async,
)
from tram.bench.serve_metrics import (
    RequestResult,
    StreamParser,
    format_report,
    is_good,
    parse_goodput,
    parse_percentiles,
    peak_concurrency,
    stats_ms,
    summarize,
)


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}"


def text_chunk(text: str | None, finish: str | None = None, **extra: Any) -> str:
    return sse({"choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra})


# ---------------------------------------------------------------- arithmetic


def test_stats_are_linear_interpolated_percentiles_in_ms() -> None:
    s = stats_ms([0.001, 0.002, 0.003, 0.004], [50, 90, 99, 99.9])
    # Rank p/100 * (n-1) between sorted values: 90 -> 2.7 -> 3 + 0.7 * (4 - 3) = 3.7.
    assert s["p50"] == pytest.approx(2.5)
    assert s["p90"] == pytest.approx(3.7)
    assert s["p99"] == pytest.approx(3.97)
    assert s["p99.9"] == pytest.approx(3.997)
    assert s["mean"] == pytest.approx(2.5) and s["median"] == pytest.approx(2.5)
    assert s["std"] == pytest.approx(math.sqrt(1.25))  # population std, as vLLM
    assert stats_ms([], [99]) == {"mean": None, "median": None, "std": None, "p99": None}


def test_tpot_excludes_the_first_token() -> None:
    r = RequestResult(success=True, ttft=0.5, latency=1.5, output_tokens=5)
    assert r.tpot == pytest.approx(0.25)
    assert RequestResult(success=True, ttft=0.5, latency=1.5, output_tokens=1).tpot is None
    assert RequestResult(success=False, ttft=0.5, latency=1.5, output_tokens=5).tpot is None


def test_goodput_counts_requests_meeting_every_slo_boundary_included() -> None:
    slos = parse_goodput(["ttft:500", "tpot:250"])
    assert slos == {"ttft": 500.0, "tpot": 250.0}
    at_limit = RequestResult(success=True, ttft=0.5, latency=1.5, output_tokens=5, requested_output_tokens=5)
    slow_ttft = RequestResult(success=True, ttft=0.5009765625, latency=1.5, output_tokens=5)
    slow_tpot = RequestResult(success=True, ttft=0.25, latency=1.5, output_tokens=5)  # tpot 312.5 ms
    one_token = RequestResult(success=True, ttft=0.125, latency=9.0, output_tokens=1)  # no tpot to miss
    failed = RequestResult(success=False, ttft=0.0, latency=0.1)
    assert [is_good(r, slos) for r in (at_limit, slow_ttft, slow_tpot, one_token, failed)] == [
        True,
        False,
        False,
        True,
        False,
    ]
    s = summarize([at_limit, slow_ttft, slow_tpot, one_token, failed], duration=4.0, slos_ms=slos)
    assert s["good_requests"] == 2 and s["request_goodput"] == pytest.approx(0.5)
    assert "request_goodput" not in summarize([at_limit], duration=1.0)
    with pytest.raises(ValueError):
        parse_goodput(["latency:5"])
    with pytest.raises(ValueError):
        parse_goodput(["ttft:-1"])


def test_throughputs_from_known_durations_and_token_counts() -> None:
    results = [
        RequestResult(
            success=True,
            prompt_tokens=10,
            output_tokens=20,
            requested_output_tokens=20,
            ttft=0.1,
            latency=1.0,
            itl=[0.05, 0.15],
            start=0.0,
        ),
        RequestResult(
            success=True,
            prompt_tokens=30,
            output_tokens=40,
            requested_output_tokens=41,
            ttft=0.3,
            latency=1.0,
            itl=[0.25],
            start=0.5,
        ),
        RequestResult(success=False, prompt_tokens=99, error="HTTP 400: no", latency=0.2, start=2.0),
    ]
    s = summarize(results, duration=2.0, percentiles=[50])
    assert (s["completed"], s["failed"]) == (2, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (40, 60)  # failures not counted
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(30.0)
    assert s["total_token_throughput"] == pytest.approx(50.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["p50_itl_ms"] == pytest.approx(150.0)  # ITLs pooled over requests: 50, 150, 250
    assert s["mean_tpot_ms"] == pytest.approx(((0.9 / 19) + (0.7 / 39)) / 2 * 1000)
    assert s["max_concurrency_observed"] == 2 and s["output_len_mismatches"] == 1
    assert s["errors"] == ["HTTP 400: no"]
    report = format_report(s)
    assert "Serving Benchmark Result" in report and "Failed requests:" in report
    assert "P50 ITL (ms):" in report and "150.00" in report


def test_peak_concurrency_does_not_overlap_touching_intervals() -> None:
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert peak_concurrency([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3
    assert peak_concurrency([]) == 0


def test_parsers_reject_bad_flags() -> None:
    assert parse_percentiles("50,99.9") == [50.0, 99.9]
    assert parse_sweep("concurrency=1,16") == ("concurrency", [1, 16])
    assert parse_sweep("rate=2,inf") == ("rate", [2.0, math.inf])
    for bad in ("concurrency=1.5", "speed=1", "rate=", "rate=0"):
        with pytest.raises(ValueError):
            parse_sweep(bad)
    with pytest.raises(ValueError):
        parse_percentiles("101")
    assert json.loads(json.dumps(json_safe({"r": [math.inf, 1.0]}))) == {"r": ["inf", 1.0]}


def test_arrival_offsets_follow_the_gamma_process() -> None:
    assert arrival_offsets(4, math.inf) == [0.0] * 4
    poisson = np.diff(arrival_offsets(4001, 50.0, 1.0, seed=1))
    assert poisson.mean() == pytest.approx(0.02, rel=0.06)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.08)  # exponential: CV 1
    even = np.diff(arrival_offsets(4001, 50.0, 4.0, seed=1))
    assert even.mean() == pytest.approx(0.02, rel=0.06)
    assert even.std() / even.mean() == pytest.approx(0.5, rel=0.08)  # gamma: CV 1/sqrt(shape)
    assert arrival_offsets(5, 3.0, seed=7) == arrival_offsets(5, 3.0, seed=7)
    assert arrival_offsets(5, 3.0, seed=7)[0] == 0.0


# ---------------------------------------------------------------- SSE parsing


def feed(parser: StreamParser, timed_lines: list[tuple[float, str]]) -> None:
    for t, line in timed_lines:
        parser.feed(line.encode(), t)


def test_parser_takes_times_from_token_chunks_and_counts_from_usage() -> None:
    p = StreamParser(sent_at=10.0)
    feed(
        p,
        [
            (10.0, ": keep-alive"),
            (10.5, text_chunk("a")),
            (10.5, ""),
            (10.75, text_chunk("b")),
            (11.0, text_chunk("c", "length")),
            (11.0, sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}})),
            (11.25, "data: [DONE]"),
        ],
    )
    r = p.result(end=11.25, sent_prompt_len=4, requested_output_tokens=7)
    assert r.success and p.done
    assert r.ttft == pytest.approx(0.5) and r.itl == pytest.approx([0.25, 0.25])
    assert r.latency == pytest.approx(1.25)
    assert (r.output_tokens, r.prompt_tokens, r.output_tokens_estimated) == (7, 9, False)  # usage wins


def test_parser_reads_usage_from_the_last_content_chunk_as_llama_cpp_sends_it() -> None:
    p = StreamParser(sent_at=0.0)
    feed(
        p,
        [
            (0.1, text_chunk("a")),
            (0.2, text_chunk("b")),
            (0.3, text_chunk("", "length", usage={"prompt_tokens": 3, "completion_tokens": 2})),
            (0.3, "data: [DONE]"),
        ],
    )
    r = p.result(0.3, sent_prompt_len=3, requested_output_tokens=2)
    assert (r.output_tokens, r.output_tokens_estimated) == (2, False)
    assert r.itl == pytest.approx([0.1])  # the empty closing chunk is not a token


def test_parser_counts_token_chunks_when_no_usage_comes() -> None:
    p = StreamParser(sent_at=0.0)
    # The empty mid-stream chunk is a token whose bytes are held back (incomplete UTF-8); the empty
    # closing chunk with a finish_reason carries nothing.
    feed(
        p,
        [
            (0.1, text_chunk("a")),
            (0.2, text_chunk("")),
            (0.3, text_chunk("b")),
            (0.4, text_chunk("", "length")),
            (0.4, "data: [DONE]"),
        ],
    )
    r = p.result(0.4, sent_prompt_len=5, requested_output_tokens=3)
    assert (r.output_tokens, r.output_tokens_estimated, r.prompt_tokens) == (3, True, 5)
    assert len(r.itl) == 2


def test_parser_chat_role_announcement_is_not_a_token() -> None:
    p = StreamParser(sent_at=0.0)
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    tok = sse({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
    feed(p, [(0.05, role), (0.2, tok), (0.3, tok), (0.3, "data: [DONE]")])
    r = p.result(0.3, 1, 2)
    assert r.ttft == pytest.approx(0.2) and (r.output_tokens, r.output_tokens_estimated) == (2, True)


def test_parser_error_in_stream_or_no_token_is_a_failure() -> None:
    p = StreamParser(sent_at=0.0)
    feed(p, [(0.1, text_chunk("a")), (0.2, sse({"error": {"message": "engine died", "code": 500}}))])
    r = p.result(0.2, 1, 5)
    assert not r.success and "engine died" in r.error
    empty = StreamParser(sent_at=0.0)
    feed(empty, [(0.1, "data: [DONE]")])
    assert not empty.result(0.1, 1, 5).success


def test_chat_payload_decodes_the_ids() -> None:
    class Tok:
        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    req = BenchRequest([5, 6], 3)
    body = build_payload("/v1/chat/completions", "m", req, Tok())
    assert body["messages"] == [{"role": "user", "content": "5 6"}]
    assert body["max_completion_tokens"] == body["max_tokens"] == 3 and body["ignore_eos"] is True
    with pytest.raises(ValueError):
        build_payload("/v1/chat/completions", "m", req, None)
    body = build_payload("/v1/completions", "m", req)
    assert body["prompt"] == [5, 6] and body["stream_options"] == {"include_usage": True}


# ---------------------------------------------------------------- against a fake server

FAIL_MARK = 7777  # a prompt starting with this id gets HTTP 400
DROP_ONCE_MARK, DROP_ALWAYS_MARK = 8888, 9999  # the connection is closed without a response


class FakeServer:
    """Streams `max_tokens` one-character chunks: `first_delay` before the first, `gap` between the rest.

    usage: "separate" (a `choices: []` chunk, as Tram and vLLM), "inline" (in the closing chunk, as
    llama.cpp) or "none". It records its own peak of requests in flight and each arrival time.
    """

    def __init__(self, first_delay: float = 0.03, gap: float = 0.002, usage: str = "separate") -> None:
        self.first_delay, self.gap, self.usage = first_delay, gap, usage
        self.active = self.peak = 0
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrivals.append(time.perf_counter())
        self.bodies.append(body)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if body["prompt"][0] == FAIL_MARK:
                return web.json_response({"error": {"message": "bad prompt", "code": 400}}, status=400)
            drops = sum(b["prompt"][0] == DROP_ONCE_MARK for b in self.bodies)
            if body["prompt"][0] == DROP_ALWAYS_MARK or (body["prompt"][0] == DROP_ONCE_MARK and drops == 1):
                request.transport.close()  # what a client sees on a keep-alive connection closed under it
                return web.Response()
            return await self._stream(request, body)
        finally:
            self.active -= 1

    async def _stream(self, request: web.Request, body: dict) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(self.first_delay)
        n = body["max_tokens"]
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
        for i in range(n):
            if i:
                await asyncio.sleep(self.gap)
            await resp.write(f"{text_chunk('x')}\n\n".encode())
        last = {"usage": usage} if self.usage == "inline" else {}
        await resp.write(f"{text_chunk('', 'length', **last)}\n\n".encode())
        if self.usage == "separate":
            await resp.write(f"{sse({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


def serve_fake(fake: FakeServer, client: Callable[[str], Awaitable[Any]]) -> Any:
    """Run `client(base_url)` in one event loop with the fake server on a free port."""

    async def main() -> Any:
        app = web.Application()
        app.router.add_post("/v1/completions", fake.completions)
        app.router.add_get("/v1/models", fake.models)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            return await client(f"http://127.0.0.1:{runner.addresses[0][1]}")
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def workload(lens: list[int], fail: set[int] = frozenset()) -> list[BenchRequest]:
    return [BenchRequest([FAIL_MARK if i in fail else 1, 2, 3 + i], n) for i, n in enumerate(lens)]


@pytest.mark.parametrize("usage", ["separate", "inline", "none"])
def test_client_against_fake_server(usage: str) -> None:
    fake = FakeServer(first_delay=0.03, gap=0.002, usage=usage)
    reqs = workload([3, 5, 8, 1, 6, 4, 2, 7], fail={2, 5})
    res = serve_fake(fake, lambda url: benchmark(url, "fake-model", reqs, warmup=1, percentiles=[50, 99]))
    assert (res["completed"], res["failed"]) == (6, 2)
    assert sum(e.startswith("HTTP 400") for e in res["errors"]) == 2
    assert res["total_output_tokens"] == sum(r.output_len for i, r in enumerate(reqs) if i not in (2, 5))
    assert res["total_input_tokens"] == 6 * 3
    assert res["output_len_mismatches"] == 0
    assert res["estimated_output_token_requests"] == (6 if usage == "none" else 0)
    assert min(t for t in res["ttfts_ms"] if t is not None) >= 30.0  # the fake's first delay
    assert res["median_itl_ms"] >= 2.0
    assert res["max_concurrency_observed"] == 8  # rate inf: every request is in flight at once
    assert len(fake.bodies) == 1 + 8  # the warmup is sent but not counted
    sent = fake.bodies[1]
    assert sent["ignore_eos"] is True and sent["stream"] is True and sent["model"] == "fake-model"


def test_a_connection_closed_before_any_response_is_retried() -> None:
    fake = FakeServer(first_delay=0.0, gap=0.0)
    reqs = [BenchRequest([DROP_ONCE_MARK, 1], 3), BenchRequest([DROP_ALWAYS_MARK, 1], 3), BenchRequest([1, 2], 3)]
    res = serve_fake(fake, lambda url: benchmark(url, "fake-model", reqs, warmup=0, max_concurrency=1))
    assert (res["completed"], res["failed"]) == (2, 1)
    assert res["errors"] == ["ServerDisconnectedError: Server disconnected"]
    # The request dropped once was sent twice; the one always dropped was given up after three tries.
    assert [b["prompt"][0] for b in fake.bodies] == [DROP_ONCE_MARK] * 2 + [DROP_ALWAYS_MARK] * 3 + [1]


def test_request_rate_spaces_the_arrivals() -> None:
    fake = FakeServer(first_delay=0.0, gap=0.0)
    reqs = workload([2] * 20)
    res = serve_fake(fake, lambda url: benchmark(url, "m", reqs, request_rate=50.0, seed=3, warmup=0))
    last = arrival_offsets(20, 50.0, 1.0, seed=3)[-1]
    assert last > 0.15  # the seeded schedule is not degenerate
    assert res["completed"] == 20 and res["duration"] >= last
    assert max(fake.arrivals) - min(fake.arrivals) >= 0.8 * last
    burst = FakeServer(first_delay=0.0, gap=0.0)
    fast = serve_fake(burst, lambda url: benchmark(url, "m", reqs, warmup=0))
    assert fast["duration"] < last / 2 and max(burst.arrivals) - min(burst.arrivals) < last / 2


def test_max_concurrency_is_honoured_and_reached() -> None:
    fake = FakeServer(first_delay=0.02, gap=0.001)
    reqs = workload([4] * 12)
    res = serve_fake(fake, lambda url: benchmark(url, "m", reqs, max_concurrency=3, warmup=0))
    assert res["completed"] == 12
    assert fake.peak == 3 and res["max_concurrency_observed"] <= 3
    # Four waves of at least the first delay each: the cap really serialises.
    assert res["duration"] >= 4 * 0.02


def test_sweep_over_two_endpoints_writes_png_and_json(tmp_path: Any, capsys: Any) -> None:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    png, out = tmp_path / "sweep.png", tmp_path / "sweep.json"
    fake = FakeServer(first_delay=0.005, gap=0.001)

    async def client(url: str) -> Any:
        args = parser.parse_args(
            [
                "--base-url",
                url,
                url + "/",
                "--label",
                "tram",
                "peer",
                "--vocab-size",
                "50",
                "--num-prompts",
                "6",
                "--input-len",
                "4:8",
                "--output-len",
                "2:5",
                "--sweep",
                "concurrency=1,4",
                "--plot",
                str(png),
                "--output-json",
                str(out),
                "--disable-tqdm",
                "--warmup",
                "1",
                "--goodput",
                "e2el:60000",
            ]
        )
        return await run_serve_async(args)

    runs = serve_fake(fake, client)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(out.read_text())
    assert isinstance(saved, list) and len(saved) == 4 == len(runs)
    assert [(r["label"], r["sweep"]["value"]) for r in saved] == [("tram", 1), ("tram", 4), ("peer", 1), ("peer", 4)]
    assert all(r["completed"] == 6 and r["good_requests"] == 6 for r in saved)
    assert saved[0]["max_concurrency_observed"] == 1 and saved[0]["model"] == "fake-model"  # from /v1/models
    assert saved[0]["total_output_tokens"] == saved[3]["total_output_tokens"]  # same workload everywhere
    assert all(set(r["machine"]["cpu"]["isa"]) >= {"avx2", "avx512f"} for r in saved)  # every run records the CPU
    printed = capsys.readouterr().out
    assert printed.count("Serving Benchmark Result") == 4 and "sweep plot written" in printed


# ---------------------------------------------------------------- against a real `tram serve`


def test_against_real_tram_serve(stories_server) -> None:
    from server_utils import assert_idle

    from tram.bench.datasets import make_requests
    from tram.bench.serve import fetch_model_id

    server = stories_server  # the session's default-flags server (one engine thread)
    reqs = make_requests(8, "8:32", "4:12", seed=0, vocab_size=512)

    async def run() -> dict:
        model = await fetch_model_id(server.url)
        return await benchmark(server.url, model, reqs, warmup=1, max_concurrency=4, percentiles=[50, 99])

    res = asyncio.run(run())
    assert_idle(server)  # the modules that share the server after this one find it idle
    assert (res["completed"], res["failed"]) == (8, 0), res["errors"]
    assert res["total_output_tokens"] == sum(r.output_len for r in reqs)
    assert res["estimated_output_token_requests"] == 0  # the counts came from usage chunks
    assert res["total_input_tokens"] == sum(r.prompt_len for r in reqs)
    assert res["p99_ttft_ms"] is not None and res["max_concurrency_observed"] <= 4
