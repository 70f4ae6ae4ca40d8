"""`tram bench throughput` and `latency`: workloads, presets, and the counts and ratios they report."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch

from tram.bench import presets
from tram.bench.datasets import make_requests, parse_range, random_requests, text_file_requests, workload_summary
from tram.bench.latency import add_latency_args, run_latency
from tram.bench.throughput import add_throughput_args, run_throughput
from tram.bench.truncated_draft import write_truncated_draft


def test_parse_range() -> None:
    assert parse_range("32:512") == (32, 512)
    assert parse_range("7") == (7, 7)
    for bad in ("0:4", "9:3", "a:b", "1:2:3", ""):
        with pytest.raises(ValueError, match="length range"):
            parse_range(bad)


def test_random_requests_are_seeded_and_in_range() -> None:
    a = random_requests(50, (3, 9), (1, 4), vocab_size=20, seed=1, exclude_ids={0, 1, 2})
    assert a == random_requests(50, (3, 9), (1, 4), vocab_size=20, seed=1, exclude_ids={0, 1, 2})
    assert a != random_requests(50, (3, 9), (1, 4), vocab_size=20, seed=2, exclude_ids={0, 1, 2})
    assert all(3 <= r.prompt_len <= 9 and 1 <= r.output_len <= 4 for r in a)
    assert all(3 <= t < 20 for r in a for t in r.prompt_token_ids)
    # Both ends of each range occur: the range is inclusive.
    assert {r.prompt_len for r in a} >= {3, 9} and {r.output_len for r in a} == {1, 2, 3, 4}
    summary = workload_summary(a)
    assert summary["prompt_tokens"] == sum(r.prompt_len for r in a) and summary["num_requests"] == 50


def test_text_file_requests_are_windows_of_the_text() -> None:
    stream = list(range(100, 130))
    reqs = text_file_requests(20, (5, 40), (2, 2), stream, seed=0)
    for r in reqs:
        first = r.prompt_token_ids[0]
        # Consecutive ids of the (repeated) text, starting anywhere.
        assert r.prompt_token_ids == [(first - 100 + i) % 30 + 100 for i in range(r.prompt_len)]


def test_make_requests_from_text_file(tmp_path: Path, stories_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(stories_path)
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a little girl who liked to play in the park. " * 5)
    reqs = make_requests(4, "8:16", "3", 0, tokenizer=tok, dataset_path=str(text))
    ids = tok(text.read_text(), add_special_tokens=False)["input_ids"]
    joined = ",".join(map(str, ids * 2))
    assert all(",".join(map(str, r.prompt_token_ids)) in joined for r in reqs)
    with pytest.raises(ValueError, match="tokenizer"):
        make_requests(4, "8", "3", 0, dataset_path=str(text))


@pytest.mark.parametrize(
    "name,params",
    [
        ("llama-15m", 15e6),
        ("llama-110m", 110e6),
        ("qwen2.5-0.5b", 494e6),
        ("llama-3.2-1b", 1.24e9),
        ("llama-3-8b", 8.0e9),
        ("qwen3-30b-a3b-4l", 3.11e9),  # 4 of Qwen3-30B-A3B's 48 layers, with its embedding and LM head
    ],
)
def test_presets_have_realistic_shapes(name: str, params: float) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    path = presets.resolve_model(name)
    assert presets.is_config_only(path) and name in presets.preset_names()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - params) / params < 0.06, count


def test_materialize_is_seeded_and_cached(tmp_path: Path, stories_path: str, monkeypatch) -> None:
    from safetensors.torch import load_file

    cfg_only = tmp_path / "tiny"
    cfg_only.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(stories_path) / f, cfg_only / f)
    monkeypatch.setattr(presets, "CHECKPOINT_CACHE", tmp_path / "cache")
    a = presets.materialize(str(cfg_only), "float32", seed=3)
    assert presets.materialize(str(cfg_only), "float32", seed=3) == a
    b = presets.materialize(str(cfg_only), "float32", seed=4)
    wa, wb = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(wa[key], wb[key])
    assert (Path(a) / "tokenizer.json").exists()


def _args(add, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_throughput_all_backends(stories_path: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = _args(
        add_throughput_args,
        [
            "--model",
            stories_path,
            "--backend",
            "tram,hf-static,hf-cb",
            "--num-prompts",
            "6",
            "--input-len",
            "4:12",
            "--output-len",
            "2:6",
            "--hf-batch-size",
            "4",
            "--threads",
            "1",
            "--kv-cache-memory-bytes",
            str(8 << 20),
            "--hf-cb-num-blocks",
            "16",
            "--output-json",
            str(out),
        ],
    )  # without it transformers takes most free memory
    report = run_throughput(args)
    wanted = report["workload"]["output_tokens"]
    assert [r["backend"] for r in report["results"]] == ["tram", "hf-static", "hf-cb"]
    for r in report["results"]:
        # Every backend generated exactly what was asked: nothing padded in, nothing cut short.
        assert r["output_tokens"] == wanted, r
        assert r["output_tokens_per_s"] == pytest.approx(wanted / r["seconds"])
        assert r["total_tokens_per_s"] == pytest.approx((wanted + report["workload"]["prompt_tokens"]) / r["seconds"])
    by = {r["backend"]: r for r in report["results"]}
    assert report["ratios"]["tram/hf-cb"] == pytest.approx(
        by["tram"]["output_tokens_per_s"] / by["hf-cb"]["output_tokens_per_s"]
    )
    assert json.loads(out.read_text())["ratios"] == report["ratios"]
    assert "model_name" in json.loads(out.read_text())["machine"]["cpu"]  # the report records the CPU


def test_throughput_rejects_unknown_backend(stories_path: str) -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        run_throughput(_args(add_throughput_args, ["--model", stories_path, "--backend", "tram,sglang"]))


def test_latency_counts_prefill_and_decode_steps(stories_path: str) -> None:
    args = _args(
        add_latency_args,
        [
            "--model",
            stories_path,
            "--batch-size",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "5",
            "--num-iters",
            "2",
            "--num-iters-warmup",
            "1",
            "--threads",
            "1",
            "--kv-cache-memory-bytes",
            str(8 << 20),
        ],
    )
    report = run_latency(args)
    # One step prefills the whole batch and samples each first token; 4 decode steps follow, per iteration.
    assert report["prefill_step"]["mean_ms"] > 0
    assert report["end_to_end"]["mean_ms"] > report["decode_step"]["mean_ms"] * 4
    assert report["num_prefill_steps"] == 2 and report["num_decode_steps"] == 8
    assert report["machine"]["threads"]["torch_threads"] == 1  # --threads 1, in force when it ran


def test_latency_refuses_a_prompt_past_the_model_length(stories_path: str) -> None:
    argv = ["--model", stories_path, "--batch-size", "1", "--input-len", "5000", "--output-len", "4"]
    args = _args(add_latency_args, [*argv, "--threads", "1", "--kv-cache-memory-bytes", str(8 << 20)])
    with pytest.raises(ValueError, match="maximum context length"):
        run_latency(args)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_throughput_speculation_on_the_copy_workload(
    stories_path: str, monkeypatch: pytest.MonkeyPatch, tmp_path, method: str
) -> None:
    """tram-spec beside tram on prompts the model's own stories make: the same tokens, the ratio, the
    acceptance, and the speed-up that acceptance allows in theory (a draft model's cost counted)."""
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")  # drafts whatever the timing
    spec = []
    if method == "draft_model":
        draft = write_truncated_draft(stories_path, 4, tmp_path)
        spec = [
            "--speculative-config",
            json.dumps({"method": method, "model": str(draft), "num_speculative_tokens": 4}),
        ]
    args = _args(
        add_throughput_args,
        [
            "--model",
            stories_path,
            "--backend",
            "tram,tram-spec",
            "--copy-workload",
            "--num-prompts",
            "3",
            "--output-len",
            "1:40",
            "--max-num-seqs",
            "1",
            "--threads",
            "1",
            "--kv-cache-memory-bytes",
            str(8 << 20),
            *spec,
        ],
    )
    report = run_throughput(args)
    by = {r["backend"]: r for r in report["results"]}
    assert by["tram"]["output_tokens"] == by["tram-spec"]["output_tokens"] == report["workload"]["output_tokens"]
    assert report["ratios"]["tram-spec/tram"] == pytest.approx(
        by["tram-spec"]["output_tokens_per_s"] / by["tram"]["output_tokens_per_s"]
    )
    got = by["tram-spec"]["info"]["spec_decoding"]
    assert got["num_accepted_tokens"] > 0 and 1 < got["mean_acceptance_length"] <= 5
    # n-gram lookup costs nothing beside the target; the draft keeps 4 of its 5 layers' weights and the
    # shared embedding: between 0.8 and 1 of the target's bytes.
    assert got["draft_cost"] == 0 if method == "ngram" else 0.8 < got["draft_cost"] < 1
    assert got["theoretical_speedup"] == pytest.approx(got["mean_acceptance_length"] / (1 + 4 * got["draft_cost"]))
    prompts = report["workload"]["prompt_tokens"]
    assert prompts > report["workload"]["output_tokens"], "each prompt holds the story its output retells"
