"""Run inside a network namespace by test_ray.py: serve stories260K over the Ray cluster at
RAY_ADDRESS with the given split, print greedy token ids and the ranks' nodes as one JSON line."""

from __future__ import annotations

import json
import sys

from tram import LLM, SamplingParams


def main() -> None:
    model, tp, pp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompts = json.loads(sys.argv[4])
    llm = LLM(
        model,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        distributed_executor_backend="ray",
        max_num_seqs=8,
        max_model_len=128,
    )
    executor = llm.llm_engine.engine_core.executor
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False
    )
    kv = llm.llm_engine.engine_core.check_kv_integrity()
    print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs], "nodes": executor.node_ips, "kv": kv}))
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
