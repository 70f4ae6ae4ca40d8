"""Offline throughput: Tram against Hugging Face transformers on the same prompts, in one run.

Every backend generates exactly --output-len tokens per request (greedy, end-of-sequence ignored),
so output tokens/s compare like with like. "hf-serial" is transformers generating one request at a
time; "hf-batched" is transformers on left-padded batches of --hf-batch-size.

    python benchmarks/offline_vs_hf.py --hf-batch-size 16
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = (REPO_ROOT / ".." / "shared" / "models" / "stories260K").resolve()
BACKENDS = ("tram", "hf-serial", "hf-batched")

# prompts (token id lists) -> output token id lists, one per prompt
GenerateFn = Callable[[list[list[int]]], list[list[int]]]


@dataclass
class Result:
    backend: str
    requests: int
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def make_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    # Ids 0-2 are unk/bos/eos in Llama-style vocabularies; random ids above them avoid special tokens.
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(num)]


def tram_backend(args: argparse.Namespace) -> GenerateFn:
    from tram import LLM, SamplingParams

    llm = LLM(str(args.model), dtype=args.dtype, seed=args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True,
                            detokenize=not args.no_detokenize)

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return generate


def hf_backend(args: argparse.Namespace, batch_size: int) -> GenerateFn:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=getattr(torch, args.dtype))
    model.eval()
    pad_id = 0  # the model has no pad token; any id works since the attention mask hides it
    # Replace the model's generation config outright: generate() merges a passed config over the
    # model's, which would bring back eos [2, 1]. With no eos, nothing stops generation and
    # min_new_tokens has nothing to suppress, so greedy picks match an engine that ignores eos.
    model.generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=args.output_len, min_new_tokens=args.output_len,
        eos_token_id=None, bos_token_id=None, pad_token_id=pad_id,
    )

    @torch.inference_mode()
    def generate(prompts: list[list[int]]) -> list[list[int]]:
        outputs: list[list[int]] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])  # [B, width], left padded
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            out = model.generate(input_ids=ids, attention_mask=mask)
            outputs.extend(row[width:].tolist() for row in out)  # [B, width + N] -> new tokens only
        return outputs

    return generate


def build(name: str, args: argparse.Namespace) -> GenerateFn:
    if name == "tram":
        return tram_backend(args)
    if name == "hf-serial":
        return hf_backend(args, batch_size=1)
    return hf_backend(args, batch_size=args.hf_batch_size)


def run_backend(name: str, args: argparse.Namespace, prompts: list[list[int]]) -> tuple[Result, list[list[int]]]:
    generate = build(name, args)
    generate(prompts[:2])  # warm-up: first-call allocations and lazy init stay outside the timing
    start = time.perf_counter()
    outputs = generate(prompts)
    seconds = time.perf_counter() - start
    tokens = sum(len(o) for o in outputs)
    return Result(name, len(prompts), tokens, seconds), outputs


def print_table(results: list[Result]) -> None:
    base = next((r.tokens_per_s for r in results if r.backend == "hf-serial"), None)
    header = f"{'backend':<12} {'requests':>8} {'out tokens':>10} {'seconds':>9} {'out tok/s':>10} {'vs hf-serial':>12}"
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        print(f"{r.backend:<12} {r.requests:>8} {r.output_tokens:>10} {r.seconds:>9.2f} "
              f"{r.tokens_per_s:>10.1f} {ratio:>12}")


def compare_outputs(outputs: dict[str, list[list[int]]]) -> list[str]:
    lines = []
    if "tram" not in outputs:
        return lines
    for name in ("hf-serial", "hf-batched"):
        if name in outputs:
            same = sum(a == b for a, b in zip(outputs["tram"], outputs[name]))
            lines.append(f"greedy outputs tram == {name}: {same}/{len(outputs['tram'])} requests identical")
    return lines


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--num-requests", type=int, default=128)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--hf-batch-size", type=int, default=0, help="0 skips hf-batched")
    p.add_argument("--backends", default="tram,hf-serial,hf-batched",
                   help="comma-separated subset of " + ",".join(BACKENDS))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch threads (default: all cores; fewer if other processes share the CPU)")
    p.add_argument("--no-detokenize", action="store_true", help="Tram skips detokenization (HF never does)")
    p.add_argument("--output-json", type=Path, default=None)
    args = p.parse_args()
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    if args.hf_batch_size <= 0:
        args.backends = [b for b in args.backends if b != "hf-batched"]
    return args


def main() -> None:
    args = parse_args()
    cpus = os.cpu_count() or 1
    torch.set_num_threads(args.threads)
    with open(args.model / "config.json") as f:
        vocab_size = int(json.load(f)["vocab_size"])
    prompts = make_prompts(args.num_requests, args.input_len, vocab_size, args.seed)

    results: list[Result] = []
    outputs: dict[str, list[list[int]]] = {}
    for name in args.backends:
        result, outputs[name] = run_backend(name, args, prompts)
        results.append(result)
        print(f"[{name}] {result.output_tokens} tokens in {result.seconds:.2f}s", flush=True)

    print(f"\nmodel {args.model.name}, {args.num_requests} requests x {args.input_len} in / "
          f"{args.output_len} out, {args.dtype}, torch threads {torch.get_num_threads()}\n")
    print_table(results)
    sanity = compare_outputs(outputs)
    for line in sanity:
        print(line)

    if args.output_json:
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": cpus, "torch": torch.__version__, "python": platform.python_version()},
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "results": [asdict(r) | {"output_tokens_per_s": r.tokens_per_s} for r in results],
            "sanity": sanity,
        }
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
