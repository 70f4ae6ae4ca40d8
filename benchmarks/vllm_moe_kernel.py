"""vLLM's CPU fused-MoE kernel timed on the inputs cpu_moe_kernel.py saved: run by that script in vLLM's
own virtual environment (`--vllm-python`), never imported by Tram.

    <vllm python> vllm_moe_kernel.py INPUTS.pt RESULT.json

INPUTS.pt holds w13 [E, 2I, H] and w2 [E, H, I] (bfloat16), and per token count x, topk_ids, topk_weights,
and the calls and repeats to time. vLLM prepacks the weights as its CPU unquantized experts do
(`cpu_prepack_moe_weight`, AMX layout where the CPU has AMX tiles, else its vector one) and runs
`cpu_fused_moe` with silu; RESULT.json gets the ISA and ms per call for each token count (best of the
repeats, after one warm-up call).
"""

from __future__ import annotations

import json
import sys

import _checkout  # noqa: F401  (this checkout's tram on sys.path: only its light timing module is used)
import torch
import vllm._custom_ops as ops

from tram.bench.timing import best_ms


def main() -> None:
    inputs, result = sys.argv[1], sys.argv[2]
    data = torch.load(inputs)
    amx = torch.cpu._is_amx_tile_supported()
    if amx:
        torch._C._cpu._init_amx()  # Linux hands out the tile registers on request, as vLLM's CPU worker asks
    isa = "amx" if amx else "vec"
    w13 = ops.cpu_prepack_moe_weight(data["w13"], isa)
    w2 = ops.cpu_prepack_moe_weight(data["w2"], isa)
    times = {}
    with torch.inference_mode():
        for case in data["cases"]:
            x, ids, weights = case["x"], case["topk_ids"], case["topk_weights"]
            out = torch.empty_like(x)

            def call(x=x, ids=ids, weights=weights, out=out) -> None:
                ops.cpu_fused_moe(out, x, w13, w2, None, None, weights, ids, "silu", isa)

            times[str(x.shape[0])] = best_ms(call, case["repeats"], case["calls"])
    meta = {"isa": isa, "threads": torch.get_num_threads(), "vllm_version": __import__("vllm").__version__}
    with open(result, "w") as f:
        json.dump({"ms": times, **meta}, f)


if __name__ == "__main__":
    main()
