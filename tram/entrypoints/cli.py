"""`tram` command line: `tram serve MODEL` (the OpenAI-compatible server) and `tram generate MODEL` (a demo)."""
from __future__ import annotations

import argparse
import os
import sys


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="local Hugging Face model folder or hub id")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks-override", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tokenizer")
    p.add_argument("--device", default="auto")
    p.add_argument("--attention-backend")
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (GPU only)")


def _engine_kwargs(a: argparse.Namespace) -> dict:
    return dict(
        dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
        num_gpu_blocks_override=a.num_gpu_blocks_override, kv_cache_memory_bytes=a.kv_cache_memory_bytes,
        enable_prefix_caching=a.enable_prefix_caching, load_format=a.load_format, seed=a.seed,
        gpu_memory_utilization=a.gpu_memory_utilization, tokenizer=a.tokenizer, device=a.device,
        attention_backend=a.attention_backend, max_logprobs=a.max_logprobs,
        enforce_eager=a.enforce_eager,
    )


def _generate(a: argparse.Namespace) -> int:
    from tram import LLM, SamplingParams

    llm = LLM(a.model, **_engine_kwargs(a))
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, seed=a.sampling_seed)
    prompts = a.prompt or ["Once upon a time", "Tom and his dog"]
    for out in llm.generate(prompts, params, use_tqdm=False):
        print(f"--- {out.prompt!r}\n{out.prompt}{out.outputs[0].text}  [{out.outputs[0].finish_reason}]")
    return 0


def _serve(a: argparse.Namespace) -> int:
    from tram.engine.arg_utils import EngineArgs
    from tram.server.api_server import ServerSettings, run_server

    settings = ServerSettings(
        engine_args=EngineArgs(a.model, **_engine_kwargs(a)), host=a.host, port=a.port,
        served_model_names=a.served_model_name, api_key=a.api_key, chat_template=a.chat_template,
        max_queued_requests=a.max_queued_requests, uvicorn_log_level=a.uvicorn_log_level,
    )
    run_server(settings)
    return 0


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server")
    _add_engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", help="name(s) clients use in 'model'")
    serve.add_argument("--api-key", default=os.environ.get("TRAM_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on /v1 routes")
    serve.add_argument("--chat-template", help="a Jinja chat template, or a file holding one")
    serve.add_argument("--max-queued-requests", type=int,
                       help="answer 429 while this many requests are already waiting")
    serve.add_argument("--uvicorn-log-level", default="warning",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from tram.bench.latency import add_latency_args
    from tram.bench.throughput import add_throughput_args

    bench = sub.add_parser("bench", help="benchmarks: throughput (offline), serve (online), latency")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    add_throughput_args(kinds.add_parser("throughput", help="offline throughput of Tram and transformers"))
    add_latency_args(kinds.add_parser("latency", help="one fixed batch: end-to-end and per-step latency"))
    from tram.bench.serve import add_serve_args

    add_serve_args(kinds.add_parser("serve", help="load any OpenAI-compatible server; TTFT, TPOT, ITL, goodput"))


def _bench(a: argparse.Namespace) -> int:
    if a.bench_command == "throughput":
        from tram.bench.throughput import run_throughput

        run_throughput(a)
    elif a.bench_command == "latency":
        from tram.bench.latency import run_latency

        run_latency(a)
    else:
        from tram.bench.serve import run_serve

        run_serve(a)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tram", description="Tram LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions for a few prompts (offline demo)")
    _add_engine_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--sampling-seed", type=int)
    _add_serve_parser(sub)
    _add_bench_parser(sub)
    args = parser.parse_args(argv)
    commands = {"serve": _serve, "generate": _generate, "bench": _bench}
    try:
        return commands[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
