"""`tram` command line: `tram serve MODEL` (the OpenAI-compatible server), `tram generate MODEL`
(a demo), `tram bench ...` (benchmarks) and `tram build-kernels` (the C++ CPU kernels, at set-up).

Engine and server flags are derived from their one declaration (`tram.config.EngineArgs`,
`tram.config.ServerArgs`); the names a layer owns (attention backends, quantization methods, tool
call parsers, ...) are registered by importing the layers' torch-free registrations first, so that
`--help` lists them and validation knows them. Each command imports only what it needs: serving
must start from a plain `pip install`, without the benchmark extras (aiohttp, matplotlib) that
`tram bench` uses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

import tram
import tram.engine.engine_config  # noqa: F401 - registers the engine's layers' choices (torch-free)
import tram.server.reasoning  # noqa: F401 - registers the reasoning parsers
import tram.server.tools.parsers  # noqa: F401 - registers the tool call parsers
from tram.config import EngineArgs, ServerArgs

# Packages that only some commands need -> the extra that installs them.
OPTIONAL_PACKAGES = {"aiohttp": "bench", "matplotlib": "bench", "triton": "gpu"}
BENCH_COMMANDS = {
    "throughput": (
        "throughput",
        "add_throughput_args",
        "run_throughput",
        "offline throughput of Tram, transformers and vLLM",
    ),
    "latency": ("latency", "add_latency_args", "run_latency", "one fixed batch: end-to-end and per-step latency"),
    "serve": ("serve", "add_serve_args", "run_serve", "load any OpenAI-compatible server; TTFT, TPOT, ITL, goodput"),
}


class MissingExtraError(SystemExit):
    """An optional package a command needs is not installed; the message names the extra."""


def import_optional(module: str, command: str) -> ModuleType:
    """Import `module`; a missing optional package becomes a one-line message naming its extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise missing_extra(e, command) from None


def missing_extra(error: ModuleNotFoundError, command: str) -> BaseException:
    package = (error.name or "").split(".")[0]
    if package not in OPTIONAL_PACKAGES:
        return error
    extra = OPTIONAL_PACKAGES[package]
    return MissingExtraError(
        f"error: `tram {command}` needs {package}, which a plain install leaves out: pip install 'tram-llm[{extra}]'"
    )


def _generate(a: argparse.Namespace) -> int:
    from tram import LLM, SamplingParams

    args = EngineArgs.from_cli_args(a)
    llm = LLM(args.model, **{k: v for k, v in vars(args).items() if k != "model"})
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, seed=a.sampling_seed)
    prompts = a.prompt or ["Once upon a time", "Tom and his dog"]
    for out in llm.generate(prompts, params, use_tqdm=False):
        print(f"--- {out.prompt!r}\n{out.prompt}{out.outputs[0].text}  [{out.outputs[0].finish_reason}]")
    return 0


def _serve(a: argparse.Namespace) -> int:
    from tram.server.http.listen import bind_socket

    engine_args, server_args = EngineArgs.from_cli_args(a), ServerArgs.from_cli_args(a)
    # Unsupported settings and a taken port fail now, in a second, before any model or engine loads.
    engine_args.validate()
    server_args.validate()
    sock = bind_socket(server_args.host, server_args.port)
    from tram.server.http.torch_free import keep_transformers_torch_free

    # Before anything imports transformers' config or tokenizer classes (see torch_free.py).
    keep_transformers_torch_free()
    from tram.server.api_server import run_server

    run_server(engine_args, server_args, sock)
    return 0


def _build_kernels(a: argparse.Namespace) -> int:
    from tram.model.kernels.build import build_kernels_command

    return build_kernels_command(a.families)


def _bench(a: argparse.Namespace) -> int:
    module, _, run, _ = BENCH_COMMANDS[a.bench_command]
    bench = import_optional(f"tram.bench.{module}", f"bench {a.bench_command}")
    try:
        getattr(bench, run)(a)
    except ModuleNotFoundError as e:  # an extra imported on first use (e.g. matplotlib for --plot)
        raise missing_extra(e, f"bench {a.bench_command}") from None
    return 0


def _add_bench_parser(sub: argparse._SubParsersAction, argv: list[str]) -> None:
    bench = sub.add_parser("bench", help="benchmarks: throughput (offline), serve (online), latency")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    wanted = argv[1] if len(argv) > 1 and argv[0] == "bench" else None
    for name, (module, add, _, help_text) in BENCH_COMMANDS.items():
        parser = kinds.add_parser(name, help=help_text)
        if name == wanted:  # only the chosen benchmark's module (and its extras) is imported
            getattr(import_optional(f"tram.bench.{module}", f"bench {name}"), add)(parser)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tram", description="Tram LLM inference engine")
    parser.add_argument("--version", action="version", version=f"tram {tram.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate completions for a few prompts (offline demo)")
    EngineArgs.add_cli_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--sampling-seed", type=int)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server (vLLM's `vllm serve` flags)")
    EngineArgs.add_cli_args(serve)
    ServerArgs.add_cli_args(serve)
    kernels = sub.add_parser("build-kernels", help="build the C++ CPU kernels now, not on first use")
    kernels.add_argument("families", nargs="*", metavar="FAMILY", help="core, gguf, quant, moe (default: all)")
    _add_bench_parser(sub, argv)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    commands = {"serve": _serve, "generate": _generate, "bench": _bench, "build-kernels": _build_kernels}
    try:
        return commands[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
