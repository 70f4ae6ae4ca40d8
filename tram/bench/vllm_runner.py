"""Runs one throughput measurement in vLLM's own virtual environment; `tram bench throughput --backend
vllm` starts it there (see tram/bench/vllm_peer.py) as

    <vllm venv>/bin/python vllm_runner.py JOB.json RESULT.json

Standard library and vLLM only: this file is run by path in a Python that has no Tram installed.

JOB.json: {"llm_kwargs": {...LLM(**kwargs)}, "requests": [[prompt token ids, output length], ...],
           "warmup": [[ids, n], ...], "ignore_eos": true, "fake": false}
RESULT.json: {"seconds", "output_tokens", "outputs" (token ids per request), "setup_seconds",
              "vllm_version", "torch_version", "torch_threads", "config" (what vLLM settled on)}

A job with "batches": [[prompt token ids, ...], ...] instead of "requests" times the first token: each
batch is submitted at once, one output token per prompt, and the engine is stepped until all are done;
RESULT.json then has "ttft": [[seconds from submission to each prompt's token, ...], ...] per batch.

With "fake": true nothing is imported and each request "generates" its output length of zeros, so
the protocol can be tested where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _fake(job: dict) -> dict:
    start = time.perf_counter()
    if "batches" in job:
        return {"ttft": [[0.0] * len(b) for b in job["batches"]], "setup_seconds": 0.0, "config": {"fake": True}}
    outputs = [[0] * n for _, n in job["requests"]]
    return {
        "seconds": time.perf_counter() - start,
        "setup_seconds": 0.0,
        "outputs": outputs,
        "output_tokens": sum(map(len, outputs)),
        "vllm_version": None,
        "torch_version": None,
        "torch_threads": None,
        "config": {"fake": True},
    }


def _settled_config(llm) -> dict:
    """The settings vLLM chose where the job left them to it (batch sizes, cache size, compile level)."""
    out: dict = {}
    try:
        cfg = llm.llm_engine.vllm_config
    except AttributeError:
        return out
    sched, cache, comp = cfg.scheduler_config, cfg.cache_config, cfg.compilation_config
    for name, obj, attrs in (
        ("scheduler", sched, ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill_enabled")),
        ("cache", cache, ("block_size", "num_gpu_blocks", "cpu_kvcache_space_bytes", "enable_prefix_caching")),
        ("compilation", comp, ("level", "mode", "backend")),
    ):
        out[name] = {a: _plain(getattr(obj, a, None)) for a in attrs if hasattr(obj, a)}
    out["max_model_len"] = cfg.model_config.max_model_len
    out["enforce_eager"] = cfg.model_config.enforce_eager
    return out


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _first_token_times(llm, batch: list[list[int]], tag: str) -> list[float]:
    """Seconds from submitting `batch` to each prompt's one output token, stepping vLLM's engine."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1, detokenize=False)
    engine, times = llm.llm_engine, [0.0] * len(batch)
    start = time.perf_counter()
    for i, ids in enumerate(batch):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                times[int(out.request_id.rsplit("-", 1)[1])] = time.perf_counter() - start
    return times


def _run_ttft(job: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(**job["llm_kwargs"])
    setup = time.perf_counter() - start
    return {
        "ttft": [_first_token_times(llm, batch, f"b{n}") for n, batch in enumerate(job["batches"])],
        "setup_seconds": setup,
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "config": _settled_config(llm),
    }


def _run(job: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    if "batches" in job:
        return _run_ttft(job)

    def generate(llm, requests):
        prompts = [{"prompt_token_ids": ids} for ids, _ in requests]
        ignore_eos = job.get("ignore_eos", True)
        params = [
            SamplingParams(temperature=0.0, ignore_eos=ignore_eos, max_tokens=n, detokenize=False) for _, n in requests
        ]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    start = time.perf_counter()
    llm = LLM(**job["llm_kwargs"])
    if job.get("warmup"):
        generate(llm, job["warmup"])  # untimed, as Tram's warm-up
    setup = time.perf_counter() - start
    before = _spec_counters(llm)
    start = time.perf_counter()
    outputs = generate(llm, job["requests"])
    seconds = time.perf_counter() - start
    after = _spec_counters(llm)
    return {
        "spec_decoding": {k: v - before.get(k, 0) for k, v in after.items()},
        "seconds": seconds,
        "setup_seconds": setup,
        "outputs": outputs,
        "output_tokens": sum(map(len, outputs)),
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "config": _settled_config(llm),
    }


def _spec_counters(llm) -> dict:
    """vLLM's speculative decoding counters (vllm:spec_decode_*), by name; {} without them."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # an engine built without stats
        return {}
    return {
        m.name: m.value
        for m in metrics
        if "spec_decode" in m.name and isinstance(getattr(m, "value", None), int | float)
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} JOB.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    result = _fake(job) if job.get("fake") else _run(job)
    with open(argv[2] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(argv[2] + ".tmp", argv[2])  # only a finished result is ever read
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
