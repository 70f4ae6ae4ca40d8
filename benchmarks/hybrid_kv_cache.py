"""The hybrid KV cache against full allocation for every layer, on a Gemma 3 1B shape (26 layers, 5
sliding layers of window 512 for each global one, one KV head of 256).

1. Capacity: how many 32k-token requests decode at once within one KV budget. The engine's own
   scheduler and KV cache manager run the workload (chunked prefill, then decode) with a stand-in
   for the model, since only block accounting decides what fits; the pool is sized from the budget
   the way the worker sizes it (bytes per block of the layout).
2. Decode step time: a real forward of a random-weight model of that width (--layers layers, default 6:
   five sliding and one global), the same requests with and without the hybrid cache.

    python3 benchmarks/hybrid_kv_cache.py [--budget-gib 4] [--context 32768] [--layers 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tram.bench.report import machine_summary
from tram.config import CacheConfig, SchedulerConfig
from tram.core.kv_cache_groups import plan_kv_cache_groups
from tram.core.request import Request
from tram.core.sched_output import ModelRunnerOutput
from tram.core.scheduler import Scheduler
from tram.sampling_params import SamplingParams

LAYERS, WINDOW, KV_HEADS, HEAD_DIM, BLOCK = 26, 512, 1, 256, 16
GEMMA3_1B_WINDOWS = [None if (i + 1) % 6 == 0 else WINDOW for i in range(LAYERS)]


def bytes_per_block(num_slots: int, elem: int = 2) -> int:
    return 2 * num_slots * BLOCK * KV_HEADS * HEAD_DIM * elem  # keys and values, bfloat16


def concurrent_decodes(hybrid: bool, budget: int, context: int, chunk: int, num_requests: int) -> tuple[int, int]:
    """(most requests decoding at once, pool blocks) for requests of `context` prompt tokens."""
    layout = plan_kv_cache_groups(GEMMA3_1B_WINDOWS, hybrid)
    num_blocks = budget // bytes_per_block(layout.num_slots)
    cache = CacheConfig(BLOCK, num_blocks, enable_prefix_caching=False, group_windows=layout.group_windows)
    # Outputs long enough that every request is still decoding when the last one is admitted.
    max_tokens = 1024
    sched = Scheduler(SchedulerConfig(num_requests, chunk, context + max_tokens), cache)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i in range(num_requests):
        prompt = [(i * 7919 + j) % 30000 + 3 for j in range(context)]
        sched.add_request(Request(str(i), prompt, params, [], context + max_tokens))
    most = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sampled = {
            rid: [7]
            for rid in out.num_scheduled_tokens
            if sched.requests[rid].num_computed_tokens == sched.requests[rid].num_tokens
        }
        decoding = sum(1 for r in sched.running if r.num_output_tokens > 0)
        most = max(most, decoding)
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    assert sched.kv_cache_manager.check_integrity()["in_use"] == 0
    return most, num_blocks


def decode_step_times(args: argparse.Namespace) -> dict[str, float]:
    """Median decode step (seconds) of --batch requests of --prompt tokens, hybrid and not."""
    import tempfile

    import torch
    import transformers

    from tram import LLM

    config = transformers.Gemma3TextConfig(
        vocab_size=32768,
        hidden_size=1152,
        intermediate_size=6912,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        sliding_window=WINDOW,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(args.layers)],
        max_position_embeddings=32768,
    )
    folder = tempfile.mkdtemp(prefix="tram-hybrid-")
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
    times: dict[str, list[float]] = {"hybrid": [], "full": []}
    for _ in range(args.rounds):  # alternating, so drift on a shared machine hits both alike
        for hybrid in (True, False):
            llm = LLM(
                folder,
                skip_tokenizer_init=True,
                max_model_len=args.prompt + 64,
                max_num_seqs=args.batch,
                disable_hybrid_kv_cache_manager=not hybrid,
            )
            times["hybrid" if hybrid else "full"].append(_median_decode_step(llm, args))
            llm.llm_engine.engine_core.shutdown()
    return {name: statistics.median(values) for name, values in times.items()}


def _median_decode_step(llm: Any, args: argparse.Namespace) -> float:
    from tram import SamplingParams as Params

    engine = llm.llm_engine
    params = Params(temperature=0, max_tokens=args.decode_steps + 1, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(str(i), {"prompt_token_ids": [(i * 31 + j) % 30000 + 3 for j in range(args.prompt)]}, params)
    steps = []
    while engine.has_unfinished_requests():
        decoding = all(r.num_output_tokens > 0 for r in engine.engine_core.scheduler.running)
        start = time.perf_counter()
        engine.step()
        if decoding and engine.engine_core.scheduler.running:
            steps.append(time.perf_counter() - start)
    return statistics.median(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-gib", type=float, default=4.0)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096, help="max_num_batched_tokens")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--layers", type=int, default=6, help="layers of the decode-time model")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens per request, decode-time run")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each, decode-time part")
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args()
    print(machine_summary())
    budget = int(args.budget_gib * 2**30)
    fits = {}
    for hybrid in (True, False):
        most, blocks = concurrent_decodes(hybrid, budget, args.context, args.chunk, args.requests)
        fits[hybrid] = most
        name = "hybrid" if hybrid else "full"
        print(f"{name:>6}: {blocks} blocks in {args.budget_gib} GiB; {most} requests of {args.context} tokens together")
    print(f"capacity ratio hybrid / full: {fits[True] / max(fits[False], 1):.2f}x")
    if not args.skip_decode:
        times = decode_step_times(args)
        print(
            f"decode step, {args.batch} x {args.prompt} tokens, {args.layers} layers: hybrid "
            f"{times['hybrid'] * 1e3:.1f} ms, full {times['full'] * 1e3:.1f} ms "
            f"(hybrid / full {times['hybrid'] / times['full']:.3f})"
        )


if __name__ == "__main__":
    main()
