"""Run inside a network namespace by test_ray.py: serve stories260K over the Ray cluster at
RAY_ADDRESS with each of the given (tp, pp) splits in turn, one driver for all of them (a driver's
start-up costs seconds), once the cluster has `nodes` nodes; print one JSON line: per split, the
greedy token ids, the ranks' nodes and the KV accounting, or the error that split raised."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from tram import LLM, SamplingParams


def run_split(model: str, tp: int, pp: int, prompts: list[list[int]]) -> dict[str, Any]:
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        distributed_executor_backend="ray",
        max_num_seqs=8,
        max_model_len=128,
    )
    try:
        executor = llm.llm_engine.engine_core.executor
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False
        )
        kv = llm.llm_engine.engine_core.check_kv_integrity()
        return {"tokens": [o.outputs[0].token_ids for o in outs], "nodes": executor.node_ips, "kv": kv}
    finally:
        llm.llm_engine.engine_core.shutdown()


def wait_for_nodes(count: int, timeout: float = 90.0) -> None:
    """Until the cluster has `count` live nodes; then leave it, so that Tram joins it itself."""
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout
        while sum(n["Alive"] for n in ray.nodes()) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"the Ray cluster did not reach {count} nodes in {timeout:.0f} s")
            time.sleep(0.25)
    finally:
        ray.shutdown()


def main() -> None:
    model, splits, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    wait_for_nodes(int(sys.argv[4]))
    results = {}
    for tp, pp in splits:
        try:
            results[f"{tp}x{pp}"] = run_split(model, tp, pp, prompts)
        except Exception:  # noqa: BLE001 - the test reports it under its split
            results[f"{tp}x{pp}"] = {"error": traceback.format_exc()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
