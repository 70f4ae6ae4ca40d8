"""benchmarks/cpu_roofline.py's counts: the work a workload fixes, whatever the engine, counted by
hand for a tiny config, and the report's ratios from a throughput JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cpu_roofline  # noqa: E402


def tiny_config() -> SimpleNamespace:
    return SimpleNamespace(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=10,
    )


def test_workload_counts_by_hand() -> None:
    # Two requests: prompts of 3 and 5 tokens, 2 and 1 output tokens.
    counts = cpu_roofline.workload_counts(tiny_config(), [3, 5], [2, 1])
    # Per token and layer, MACs: q and o 8*8 each, k and v 8*4 each, gate/up/down 3*8*16.
    per_token = 2 * (64 + 64 + 32 + 32 + 384)
    fed = 3 + 5 + 2 + 1 - 2  # the last output token of each request is never fed back
    assert counts["tokens"] == fed
    assert counts["gemm_flops"] == 2 * (fed * per_token + 3 * 8 * 10)  # 3 LM-head rows
    # Request 1's second output token reads a 4-token context; nothing else decodes.
    assert counts["kv_elements"] == 4 * 2 * 2 * 1 * 4


def test_report_uses_each_engines_best_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "results": [
                    {"backend": "tram", "seconds": 6.0},
                    {"backend": "tram", "seconds": 5.0},
                    {"backend": "vllm-eager", "seconds": 9.0},
                    {"backend": "vllm-compile", "seconds": 7.5},
                ]
            }
        )
    )
    cpu_roofline.report_results(str(path), floor=2.5)
    out = capsys.readouterr().out
    assert "| tram | 5.00 | 2.00 |" in out
    assert "an engine at the floor would be 3.00x the best vLLM configuration; Tram is 1.50x" in out
