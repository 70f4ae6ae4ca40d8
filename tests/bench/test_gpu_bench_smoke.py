"""benchmarks/gpu_bench.py --smoke: the whole GPU benchmark (code in benchmarks/gpu/) on the CPU with tiny sizes.

The script is run once, as a subprocess (as it will be run on the GPU machine), and each section
is checked by its own test, so a broken section (e.g. the Triton kernels) fails only its test.
The run with a failing section starts at the same time, beside it: each run's section children are
mostly one busy thread, so on a small machine the two together take little longer than one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_bench.py"
# The smoke run takes ~35 s on a small CPU; the limit only catches a hang, not slowness.
TIMEOUT_S = 300


# A run whose kernels section fails: num_splits 0 is rejected by paged_attention after the section's
# write_kv_cache rows, in its own child process, and decode still runs and reports.
FAILING_RUN = ("--sections", "kernels,decode", "--kernel-splits", "0", "--decode-batches", "1")


class BenchRun:
    """`gpu_bench.py --smoke --out FOLDER/results.json EXTRA` started in a subprocess; `result()` waits
    for it. Its output goes to files, not pipes, so that a run nobody is reading yet never blocks."""

    def __init__(self, folder: Path, *extra: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.folder = folder / "results.json", folder
        env = {k: v for k, v in os.environ.items() if k != "OUT"}  # --out decides, not the device's $OUT
        with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
            self.start = time.perf_counter()
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--smoke", "--out", str(self.out), *extra],
                stdout=stdout,
                stderr=stderr,
                text=True,
                env=env,
            )
        self.done: subprocess.CompletedProcess[str] | None = None
        self.seconds = 0.0

    def result(self) -> subprocess.CompletedProcess[str]:
        """The finished run (as subprocess.run returns it); raises TimeoutExpired if it hangs."""
        if self.done is None:
            try:
                code = self.proc.wait(max(1.0, TIMEOUT_S - (time.perf_counter() - self.start)))
            except subprocess.TimeoutExpired:
                self.stop()
                raise
            self.seconds = time.perf_counter() - self.start
            self.done = subprocess.CompletedProcess(
                self.proc.args, code, (self.folder / "stdout").read_text(), (self.folder / "stderr").read_text()
            )
        return self.done

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, BenchRun]]:
    folder = tmp_path_factory.mktemp("gpu_bench")
    started = {"smoke": BenchRun(folder / "smoke"), "failing": BenchRun(folder / "failing", *FAILING_RUN)}
    yield started
    for run in started.values():  # a run that a failed test never waited for
        run.stop()


@pytest.fixture(scope="module")
def smoke(runs: dict[str, BenchRun]) -> dict[str, Any]:
    run = runs["smoke"]
    proc = run.result()
    assert run.out.exists(), f"no report written (rc {proc.returncode})\n{proc.stderr[-4000:]}"
    return {"report": json.loads(run.out.read_text()), "proc": proc, "seconds": run.seconds}


def section(smoke: dict[str, Any], name: str) -> dict[str, Any]:
    entry = smoke["report"]["sections"].get(name)
    assert entry is not None, f"section {name} missing from the report"
    assert entry["status"] == "ok", f"{name}: {entry.get('error')}\n{entry.get('traceback', '')}"
    return entry["results"]


def assert_positive(row: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value, row)


def test_meta_and_table(smoke: dict[str, Any]) -> None:
    meta = smoke["report"]["meta"]
    assert meta["smoke"] is True and meta["date"]
    for pkg in ("torch", "triton", "transformers"):
        assert meta["versions"][pkg], pkg
    assert meta["device"]["type"] == "cpu" and meta["device"]["name"]
    assert "model_name" in meta["machine"]["cpu"] and set(meta["machine"]["cpu"]["isa"]) >= {"avx2", "amx_bf16"}
    assert set(smoke["report"]["sections"]) == {"decode", "kernels", "quant", "throughput"}
    stdout = smoke["proc"].stdout
    for name in ("decode", "kernels", "quant", "throughput"):
        assert f"== {name}:" in stdout, stdout


def test_decode_section(smoke: dict[str, Any]) -> None:
    res = section(smoke, "decode")
    assert_positive(res["copy"], "bandwidth_GBps", "copy_ms")
    assert [r["batch"] for r in res["rows"]] == [1, 4]
    for row in res["rows"]:
        assert_positive(
            row,
            "step_ms",
            "bound_ms",
            "ratio",
            "output_tok_per_s",
            "weight_bytes_read",
            "kv_bytes_read",
            "prefill_steps",
        )
        assert row["measured_steps"] == 3
        assert row["ratio"] == pytest.approx(row["step_ms"] / row["bound_ms"])
    # More sequences read more KV; the weights are read once whatever the batch.
    assert res["rows"][1]["kv_bytes_read"] > res["rows"][0]["kv_bytes_read"]
    # --profile-batches (smoke: 4): where the profiled steps' time went.
    assert res["rows"][0]["profile"] is None
    prof = res["rows"][1]["profile"]
    assert prof["steps"] == 3 and prof["wall_ms_per_step"] > 0 and prof["device_busy_ms_per_step"] > 0
    assert prof["top"] and all(k["ms_per_step"] >= 0 and k["calls_per_step"] > 0 for k in prof["top"])
    assert prof["top"][0]["ms_per_step"] == max(k["ms_per_step"] for k in prof["top"])


def test_throughput_section(smoke: dict[str, Any]) -> None:
    res = section(smoke, "throughput")
    w = res["workload"]
    for name in ("tram", "hf"):
        assert res[name]["output_tokens"] == w["requests"] * w["output_len"], (name, res[name])
        assert_positive(res[name], "output_tok_per_s", "seconds")
    assert res["hf"]["timed_out"] is False
    assert_positive(res, "ratio_tram_over_hf")
    assert_positive(res["compute_floor"], "flops", "seconds", "max_output_tok_per_s")
    assert_positive(res["matmul"], "matmul_TFLOPs")


def test_kernels_section(smoke: dict[str, Any]) -> None:
    res = section(smoke, "kernels")
    assert res["shape"]["triton_interpret"] == "1"
    assert res["all_correct"] is True
    assert len(res["write_kv_cache"]) == 2
    for row in res["write_kv_cache"]:
        assert row["correct"] is True, row
        assert_positive(row, "tram_ms", "torch_index_copy_ms", "speedup_vs_torch")
    assert [(r["batch"], r["num_splits"]) for r in res["decode"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [r["case"] for r in res["prefill"]] == ["prefill", "chunk_after_prefix"]
    for row in res["decode"] + res["prefill"]:
        assert row["all_written"] is True and row["correct"] is True, row
        assert row["rel_err"] < 2e-2, row  # bf16 operands against a float32 reference
        assert_positive(row, "tram_ms", "sdpa_ms", "speedup_vs_sdpa", "tram_GBps", "tram_TFLOPs")


def test_quant_section(smoke: dict[str, Any]) -> None:
    res = section(smoke, "quant")
    assert res["setup"]["triton_interpret"] == "1" and res["setup"]["from_preset"] is False
    assert res["all_correct"] is True
    assert [(r["N"], r["K"], r["rows"]) for r in res["rows"]] == [
        (64, 128, 1),
        (64, 128, 17),
        (64, 256, 1),
        (64, 256, 17),
    ]
    for row in res["rows"]:
        n, k = row["N"], row["K"]
        assert_positive(row["float"], "ms", "GBps", "TFLOPs")
        assert row["float"]["weight_bytes"] == n * k * 2  # bf16
        for name, group, packed in (("int8", 0, n * k + 4 * n), ("int4", 128, n * k // 2 + 4 * n * k // 128)):
            entry = row[name]
            assert entry["group"] == group and entry["weight_bytes"] == packed, (name, entry)
            assert entry["correct"] is True and entry["finite"] is True, (name, row)
            assert entry["rel_err"] < res["setup"]["rel_tol"] == 1e-2, (name, entry)
            assert_positive(entry, "ms", "speedup_vs_float", "GBps", "fraction_of_copy_bw", "TFLOPs")


def test_quant_shapes_of_the_default_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU run's shapes come from the preset, which --smoke replaces with fixed tiny ones: checked
    # here in-process, with the per-layer totals, and that the section is in the default set.
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from gpu.cli import parse_args
    from gpu.common import hf_config
    from gpu.quant import layer_totals, model_shapes

    args = parse_args([])
    assert "quant" in args.sections and args.quant_rows == "1,16,64,256" and "quant" in args.timeouts
    shapes = model_shapes(hf_config(args))
    assert [(s.label, s.out_features, s.in_features) for s in shapes] == [
        ("q_proj/o_proj", 4096, 4096),
        ("k_proj/v_proj", 1024, 4096),
        ("gate_proj/up_proj", 14336, 4096),
        ("down_proj", 4096, 14336),
    ]
    rows = [
        {"shape": s.label, "rows": 1, "float": {"ms": 2.0}, "int8": {"ms": 1.0}, "int4": {"ms": 0.5}} for s in shapes
    ]
    (total,) = layer_totals(rows, shapes, [1])
    assert total["float_ms"] == 14.0 and total["int8_ms"] == 7.0 and total["int4_ms"] == 3.5  # 7 linears
    assert total["int4_speedup_vs_float"] == 4.0


def test_smoke_is_quick(smoke: dict[str, Any]) -> None:
    assert smoke["proc"].returncode == 0, smoke["proc"].stderr[-4000:]
    assert smoke["seconds"] < 120, f"smoke run took {smoke['seconds']:.0f} s"


def test_failing_section_keeps_the_others(runs: dict[str, BenchRun]) -> None:
    # FAILING_RUN: the kernels section fails after its write_kv_cache rows, decode still reports.
    run = runs["failing"]
    proc = run.result()
    assert proc.returncode == 1, proc.stderr[-4000:]
    sections = json.loads(run.out.read_text())["sections"]
    assert sections["kernels"]["status"] == "error" and sections["kernels"]["error"]
    assert len(sections["kernels"]["results"]["write_kv_cache"]) == 2  # partial results kept
    assert sections["decode"]["status"] == "ok"
    assert_positive(sections["decode"]["results"]["rows"][0], "step_ms")
    assert "ERROR:" in proc.stdout


def test_transformers_config_fields_this_version_lacks_are_left_out() -> None:
    # The GPU machines' transformers (5.17) has no auto_switch_to_flash; passing it raised TypeError.
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from tram.bench.hf_backends import known_fields

    kwargs = {"num_blocks": 64, "no_such_field_in_any_version": False}
    assert known_fields(ContinuousBatchingConfig, kwargs) == {"num_blocks": 64}
    ContinuousBatchingConfig(**known_fields(ContinuousBatchingConfig, kwargs))
