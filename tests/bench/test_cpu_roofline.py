"""benchmarks/cpu_roofline.py's counts: the work a workload fixes, whatever the engine, counted by
hand for a tiny config, and the report's ratios from a throughput JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cpu_decode_floor  # noqa: E402
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


def tiny_moe_config(**extra) -> SimpleNamespace:
    """tiny_config with 4 experts of width 6, 2 chosen per token (Qwen3-MoE's names)."""
    return SimpleNamespace(
        **vars(tiny_config()), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6, **extra
    )


def test_moe_workload_counts_only_the_chosen_experts() -> None:
    # Layer 0 is kept dense by mlp_only_layers: gate/up/down 3*8*16; layer 1 routes (router 8*4)
    # to 2 experts of 3*8*6 each.
    counts = cpu_roofline.workload_counts(tiny_moe_config(mlp_only_layers=[0]), [3], [2])
    per_token = 2 * (64 + 64 + 32 + 32) + 3 * 8 * 16 + (8 * 4 + 2 * 3 * 8 * 6)
    assert counts["gemm_flops"] == 2 * (4 * per_token + 2 * 8 * 10)


def test_decode_weight_bytes_by_hand() -> None:
    # Outputs of 3 and 2 tokens: the first token of each comes from the prefill, so step 1 serves both
    # requests and step 2 the first. A step reads the whole dense model (2 B/weight) and one embedding row per
    # request: per layer q, o 64, k, v 32, MLP 384, norms 16; the final norm 8; the LM head 80.
    whole = 2 * (64 + 64 + 32 + 32 + 384 + 16) + 8
    per_step = 2 * (whole + 80)
    rows = 2 * 8 * (2 + 1)  # embedding rows of 8 weights: 2 at step 1, 1 at step 2
    assert cpu_roofline.decode_weight_bytes(tiny_config(), 2, [3, 2]) == 2 * per_step + rows


def test_expected_distinct_experts_match_uniform_routing() -> None:
    gen = torch.Generator().manual_seed(0)
    for experts, top_k, batch in ((128, 8, 1), (128, 8, 16), (128, 8, 64), (8, 2, 4)):
        # Each token draws top_k distinct experts uniformly; count the distinct ones of the batch.
        draws = torch.rand(2000, batch, experts, generator=gen).argsort(-1)[..., :top_k]
        seen = torch.zeros(2000, experts).scatter_(1, draws.reshape(2000, -1), 1.0).sum(1)
        expected = cpu_decode_floor.expected_distinct(experts, top_k, batch)
        assert abs(seen.mean().item() - expected) < 0.01 * experts, (experts, top_k, batch)


def test_module_timers_add_each_class_and_come_off() -> None:
    """--modules: each module class's forward time, a nested module counted in its own class and in its
    parent's; the hooks removed leave the model as it was."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    totals: dict[str, float] = {}
    handles = cpu_decode_floor._module_timers(model, totals)
    model(torch.randn(2, 4))
    model(torch.randn(2, 4))
    assert set(totals) == {"Sequential", "Linear", "ReLU"}
    assert totals["Sequential"] >= totals["Linear"] + totals["ReLU"] > 0
    for handle in handles:
        handle.remove()
    model(torch.randn(2, 4))
    assert not model._forward_hooks and not model._forward_pre_hooks and not model[0]._forward_hooks


def test_decode_step_bytes_by_hand() -> None:
    cfg = tiny_moe_config(mlp_only_layers=[0])
    table = cpu_decode_floor.table_from_config(cfg, elem=2)
    # Per layer: attention 192 weights and two norms of 8; layer 0's dense MLP 384, layer 1's router 32.
    assert table.whole == 2 * (1 * 8 + 2 * (192 + 16) + 384 + 32)
    assert table.expert == {1: 2 * 3 * 8 * 6}
    distinct = cpu_decode_floor.uniform_distinct(cfg, batch=3)
    assert distinct == {1: pytest.approx(4 * (1 - 0.5**3))}
    step = cpu_decode_floor.step_weight_bytes(table, 3, distinct)
    assert step["experts"] == pytest.approx(2 * 3 * 8 * 6 * 3.5)
    assert step["lm_head"] == 2 * 10 * 8 and step["embedding"] == 2 * 3 * 8


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
    cpu_roofline.report_results(str(path), {"floor": 2.5, "floor by phase": 3.75})
    out = capsys.readouterr().out
    assert "| tram | 5.00 | 2.00 | 1.33 |" in out
    assert "an engine at the floor would be 3.00x the best vLLM configuration; Tram is 1.50x" in out
    assert "an engine at the floor by phase would be 2.00x the best vLLM configuration" in out


def test_floor_by_phase_by_hand() -> None:
    # Prompts of 3 and 5 tokens, outputs of 3 and 2: the prefill feeds 8 tokens and samples 2 LM-head
    # rows; decode step 1 serves both requests, step 2 the first. 1 GFLOP/s and 1 GB/s make seconds
    # of FLOPs and bytes directly.
    cfg = tiny_config()
    per_token = 64 + 64 + 32 + 32 + 384  # MACs per layer, as in test_workload_counts_by_hand
    per_token *= 2
    phases = cpu_roofline.floor_by_phase(cfg, 2, [3, 5], [3, 2], peak=1.0, stream=1.0)
    assert phases["prefill"] == pytest.approx(2 * (8 * per_token + 2 * 8 * 10) / 1e9)
    whole = 2 * (2 * (64 + 64 + 32 + 32 + 384 + 16) + 8)  # bytes, as in test_decode_weight_bytes_by_hand
    decode = 0.0
    for batch in (2, 1):
        head = max(2 * 10 * 8, 2 * batch * 8 * 10)  # 160 bytes; 160 or 320 FLOPs
        rest = max(whole + 2 * 8 * batch, 2 * batch * per_token)
        decode += head + rest
    assert phases["decode"] == pytest.approx(decode / 1e9)
    # At batch 2 the FLOPs outweigh the bytes, at batch 1 the rest's bytes its FLOPs: the phases add up
    # to more than the larger of the workload's whole FLOPs and whole reads.
    flops = cpu_roofline.workload_counts(cfg, [3, 5], [3, 2])["gemm_flops"] / 1e9
    reads = cpu_roofline.decode_weight_bytes(cfg, 2, [3, 2]) / 1e9
    assert phases["prefill"] + phases["decode"] > max(flops, reads)


def test_prefill_flops_and_report_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two prompts of 3 tokens: per token and layer 576 linear MACs (2 layers), one LM-head row; causal
    # attention over 1+2+3 = 6 positions per head and layer: QK^T and PV, head_dim 4, 2 heads, 2 layers.
    per_prompt = 2 * (3 * 2 * 576 + 8 * 10) + 2 * 2 * 2 * 2 * 4 * 6
    assert cpu_roofline.prefill_flops(tiny_config(), 2, 3) == 2 * per_prompt
    path = tmp_path / "prefill.json"
    rows = [{"workload": "2x3", "backend": "tram", "last_ms": 2 * per_prompt / 1e3, "prefill_tokens_per_s": 1.0}]
    path.write_text(json.dumps({"results": rows}))
    cpu_roofline.report_prefill(str(path), tiny_config(), peak=1e-3, goal=1.5)  # 1 MFLOP/s: the floor is 1x
    assert "| 1.00 |" in capsys.readouterr().out
    rows[0]["last_ms"] *= 2
    path.write_text(json.dumps({"results": rows}))
    cpu_roofline.report_prefill(str(path), tiny_config(), peak=1e-3, goal=1.5)
    assert "| 2.00 (over) |" in capsys.readouterr().out
