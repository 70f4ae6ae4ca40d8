"""`tram bench latency --prefill`: workloads, Tram's first-token times, the llama-server client, vLLM's
runner protocol and the ratios the report prints."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import assert_no_leak

from tram.bench import prefill, vllm_peer
from tram.bench.latency import add_latency_args, run_latency
from tram.bench.prefill import PrefillResult, Workload
from tram.bench.throughput import backend_names


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_latency_args(p)
    return p.parse_args(argv)


def test_parse_workloads_and_backends() -> None:
    assert prefill.parse_workloads("1x2048, 16X512") == [Workload(1, 2048), Workload(16, 512)]
    for bad in ("16", "0x512", "4x", "ax8", ""):
        with pytest.raises(ValueError, match="workload"):
            prefill.parse_workloads(bad)
    names = backend_names("tram,vllm,llama-server", prefill.BACKENDS, prefill.ALIASES)
    assert names == ["tram", "vllm-eager", "vllm-compile", "llama-server"]
    with pytest.raises(ValueError, match="unknown backend"):
        backend_names("tram,sglang", prefill.BACKENDS, prefill.ALIASES)


def test_batches_are_seeded_and_shaped() -> None:
    a = prefill.workload_batches(Workload(3, 7), 2, 500, seed=1)
    assert a == prefill.workload_batches(Workload(3, 7), 2, 500, seed=1)
    assert [len(b) for b in a] == [3, 3] and all(len(ids) == 7 and max(ids) < 500 for b in a for ids in b)
    assert a[0] != a[1], "each batch has prompts of its own"


def test_tram_first_token_times(llm) -> None:
    batch = prefill.workload_batches(Workload(4, 30), 1, 500, seed=0)[0]
    times = prefill.tram_first_token_times(llm.llm_engine, batch, "t")
    assert len(times) == 4 and all(t > 0 for t in times)
    assert_no_leak(llm.llm_engine)


def test_a_prompt_past_the_model_length_is_a_clear_error(llm) -> None:
    limit = llm.llm_engine.input_processor.max_model_len
    batch = prefill.workload_batches(Workload(2, limit + 1), 1, 500, seed=0)[0]
    with pytest.raises(ValueError, match="maximum context length"):
        prefill.tram_first_token_times(llm.llm_engine, batch, "long")
    assert not llm.llm_engine.has_unfinished_requests()


def test_prefill_report_on_tram(stories_path: str, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    argv = ["--model", stories_path, "--prefill", "--workloads", "1x40,3x20", "--num-iters", "2"]
    report = run_latency(_args([*argv, "--threads", "1", "--output-json", str(out)]))
    rows = {r["workload"]: r for r in report["results"]}
    assert set(rows) == {"1x40", "3x20"} and all(r["backend"] == "tram" for r in rows.values())
    assert [len(b) for b in rows["3x20"]["ttft"]] == [3, 3]  # two timed batches, the warm-up left out
    for r in rows.values():
        assert 0 < r["mean_ms"] <= r["last_ms"]
    assert rows["3x20"]["prefill_tokens_per_s"] == pytest.approx(60 / (rows["3x20"]["last_ms"] / 1e3))
    assert json.loads(out.read_text())["results"][0]["workload"] == "1x40"


def test_ratio_against_the_best_peer(capsys) -> None:
    results = [
        PrefillResult("tram", "2x10", [[0.5, 1.0], [0.4, 0.8]]),
        PrefillResult("vllm-eager", "2x10", [[1.0, 1.6]]),
        PrefillResult("llama-server", "2x10", [[1.0, 1.2]]),
    ]
    assert results[0].last_s == 0.8 and results[0].mean_s == pytest.approx(0.6)
    assert results[0].tokens_per_s == pytest.approx(20 / 0.8)
    assert prefill.print_report(results) == {"2x10": pytest.approx(1.2 / 0.8)}
    assert "best peer's (llama-server)" in capsys.readouterr().out


class _FakeLlamaServer(BaseHTTPRequestHandler):
    """llama-server's /completion as far as the client uses it; a batch's requests must all arrive
    before any is answered (the barrier), so a client that sent them one by one would fail."""

    barrier: threading.Barrier
    bodies: list[dict]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        type(self).barrier.wait(timeout=10)
        answer = json.dumps({"content": "x", "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 5.0}})
        self.send_response(200 if self.path == "/completion" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args) -> None:
        pass


def test_llama_server_client_sends_a_batch_at_once() -> None:
    _FakeLlamaServer.barrier, _FakeLlamaServer.bodies = threading.Barrier(3), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeLlamaServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args = argparse.Namespace(llama_server_url=url, num_iters_warmup=1)
        plan = {Workload(3, 5): prefill.workload_batches(Workload(3, 5), 2, 100, seed=0)}
        (result,) = prefill.run_llama_server(args, plan)
    finally:
        server.shutdown()
        server.server_close()
    assert result.backend == "llama-server" and len(result.ttft) == 1 and len(result.ttft[0]) == 3
    assert result.info["server_prompt_ms"] == [5.0]
    sent = _FakeLlamaServer.bodies
    assert sorted(b["prompt"] for b in sent[3:]) == sorted(plan[Workload(3, 5)][1])
    assert all(b["n_predict"] == 1 and b["cache_prompt"] is False for b in sent)
    with pytest.raises(ValueError, match="--llama-server-url"):
        prefill.run_llama_server(argparse.Namespace(llama_server_url=None, num_iters_warmup=0), plan)


def test_vllm_runner_first_token_protocol_in_fake_mode(tmp_path: Path) -> None:
    job = {"llm_kwargs": {}, "batches": [[[5, 6, 7], [8]], [[9]]], "fake": True}
    result = vllm_peer.run_job(sys.executable, job, {}, timeout=60, log_path=tmp_path / "log")
    assert result["ttft"] == [[0.0, 0.0], [0.0]]
