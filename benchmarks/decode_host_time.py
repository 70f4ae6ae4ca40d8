"""A decode step's host time: the module path against each layer's kernels chosen once (cpu_decode.py).

A Llama so narrow (hidden 64, 30 layers, random weights) that its kernels cost next to nothing, so a
decode step's time is the Python and dispatch around them. One request decodes --tokens tokens on one
thread, --repeats times in each of two processes (TRAM_CPU_DECODE_PROGRAM=0, then 1); the best three
runs' mean time per step is printed for each, and their ratio.

    python3 benchmarks/decode_host_time.py [--layers 30] [--tokens 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = Path(__file__).resolve().parent.parent / "tram" / "bench" / "presets"


def make_model(folder: Path, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in os.listdir(PRESETS / "tokenizer"):
        shutil.copy(PRESETS / "tokenizer" / name, folder / name)


def measure(folder: str, tokens: int, repeats: int) -> list[float]:
    """Microseconds per decode step, one per repeat (run in the child process)."""
    from tram import LLM, SamplingParams

    llm = LLM(folder, dtype="float32", max_model_len=tokens + 16)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
    prompt = [{"prompt_token_ids": [1, 2, 3]}]
    llm.generate(prompt, params)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompt, params)
        times.append((time.perf_counter() - start) / tokens * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.tokens, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        make_model(Path(tmp), args.layers)
        best = {}
        for program in ("0", "1"):
            env = {**os.environ, "TRAM_CPU_DECODE_PROGRAM": program, "TRAM_CPU_THREADS": "1"}
            cmd = [sys.executable, __file__, "--child", tmp, "--tokens", str(args.tokens)]
            cmd += ["--repeats", str(args.repeats)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            times = sorted(json.loads(out.strip().splitlines()[-1]))[:3]
            best[program] = sum(times) / len(times)
            print(f"TRAM_CPU_DECODE_PROGRAM={program}: {best[program]:.0f} us a step ({args.layers} layers)")
    print(f"module path / program: {best['0'] / best['1']:.2f}x")


if __name__ == "__main__":
    main()
