"""tram.bench.serve_compare: the peer scripts' table and the ratios they report."""

from __future__ import annotations

import pytest

from tram.bench.serve_compare import print_serve_comparison


def result(label: str, conc: int, tok_s: float, p99: float) -> dict:
    return {
        "label": label,
        "sweep": {"value": conc},
        "output_throughput": tok_s,
        "p50_ttft_ms": p99 / 2,
        "p99_ttft_ms": p99,
        "p50_tpot_ms": None,
        "failed": 0,
        "output_len_mismatches": 0,
    }


def test_ratios_against_the_chosen_peer(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [
        result("tram", 1, 200.0, 100.0),
        result("slow", 1, 50.0, 400.0),
        result("fast", 1, 100.0, 200.0),
        result("tram", 16, 600.0, 300.0),
        result("slow", 16, 300.0, 900.0),
    ]  # "fast" missing at 16

    def best(by: dict, conc: int) -> dict | None:
        found = [by[(e, conc)] for e in ("slow", "fast") if (e, conc) in by]
        return max(found, key=lambda r: r["output_throughput"]) if found else None

    rows = print_serve_comparison(runs, ("tram", "slow", "fast"), best)
    assert rows == [
        {"concurrency": 1, "peer": "fast", "throughput_ratio": 2.0, "p99_ttft_ratio": 0.5},
        {"concurrency": 16, "peer": "slow", "throughput_ratio": 2.0, "p99_ttft_ratio": 300.0 / 900.0},
    ]
    out = capsys.readouterr().out
    assert "(tram / fast;" in out and "(tram / slow;" in out
    assert print_serve_comparison([result("slow", 1, 1.0, 1.0)], ("tram", "slow"), best) == []  # no Tram run
