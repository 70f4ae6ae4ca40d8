"""The llama.cpp peer: build `llama-server`, convert a Hugging Face model to GGUF, and serve both it and
Tram to `tram bench serve` with identical requests.

One command does all of it (build and conversion are cached under ~/.cache/tram/llama.cpp):

    python3 benchmarks/llama_cpp_peer.py compare --model llama-15m --dtype float32 --concurrency 1,16,64
    python3 benchmarks/llama_cpp_peer.py compare --model qwen2.5-0.5b --gguf-type Q4_K_M   # the same GGUF file
    python3 benchmarks/llama_cpp_peer.py compare --model qwen3-30b-a3b-4l --dtype bfloat16 --gguf-type Q4_K_M
    python3 benchmarks/llama_cpp_peer.py prefill --model qwen2.5-0.5b --gguf-type Q4_K_M   # time to first token

Steps, each also runnable alone:
    build    pip-download the llama-cpp-python sdist (it vendors llama.cpp) and build llama-server and
             llama-quantize (the GGUF tests use it and the converter)
    convert  save the model (dummy weights are materialised with a fixed seed) and convert it to GGUF
             (--gguf-type: quantize it too; minutes for a large preset, so it can be done ahead)
    compare  serve the model with `tram serve` and llama-server and run `tram bench serve` against each,
             the two taking turns level by level
    prefill  serve it with llama-server and run `tram bench latency --prefill` on Tram (offline), on it
             and on vLLM with --backend tram,llama-server,vllm

TRAM_LLAMA_CPP_MARCH=x86-64-v3 builds and serves a llama.cpp for that target instead of this CPU (its
own build folder), the peer of Tram built with TRAM_CPU_MARCH=x86-64-v3: both as an AVX2-only CPU
(AMD Zen 3) would run them.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)

from tram.bench.serve_compare import print_serve_comparison
from tram.bench.server_process import ServerProcess, TramServer

# With 16 requests at concurrency 1, p99 TTFT is in effect the slowest prompt's, and it moved 20-30%
# between identical runs on this shared machine; 32 requests give a steadier sample.
MIN_PROMPTS = 32
CACHE = Path(os.environ.get("TRAM_LLAMA_CPP_CACHE", Path.home() / ".cache" / "tram" / "llama.cpp"))


def log(msg: str) -> None:
    print(f"[llama_cpp_peer] {msg}", file=sys.stderr, flush=True)


def source_dir() -> Path:
    """The llama.cpp tree vendored by llama-cpp-python's source distribution, downloaded once."""
    found = sorted(glob.glob(str(CACHE / "src" / "llama_cpp_python-*" / "vendor" / "llama.cpp")))
    if found:
        return Path(found[-1])
    (CACHE / "src").mkdir(parents=True, exist_ok=True)
    log("downloading the llama-cpp-python source distribution with pip")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            "llama-cpp-python",
            "-d",
            str(CACHE / "src"),
        ],
        check=True,
    )
    archive = sorted(glob.glob(str(CACHE / "src" / "llama_cpp_python-*.tar.gz")))[-1]
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE / "src", filter="data")
    return source_dir()


TOOLS = ("llama-server", "llama-quantize")


def build_dir() -> Path:
    march = os.environ.get("TRAM_LLAMA_CPP_MARCH", "").strip()
    return CACHE / (f"build-{march}" if march else "build")


def tool_binary(name: str) -> Path:
    return build_dir() / "bin" / name


def server_binary() -> Path:
    return tool_binary("llama-server")


# llama.cpp's AMX kernels (tinygemm_kernel_amx) died with SIGILL at the first step on this project's
# Sapphire Rapids VMs (a tilezero on a worker thread; AMX itself runs here when configured), and
# -march=native turns them on wherever cpuid reports AMX. Only its prefill of a few types uses them.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def build() -> Path:
    """llama-server and llama-quantize (the GGUF tests' quantizer), built once; returns llama-server."""
    binary, folder = server_binary(), build_dir()
    march = os.environ.get("TRAM_LLAMA_CPP_MARCH", "").strip()
    cache = folder / "CMakeCache.txt"
    if all(tool_binary(name).exists() for name in TOOLS) and (march or NO_AMX in cache.read_text()):
        return binary
    src = source_dir()
    log(f"building {' and '.join(TOOLS)} from {src} into {folder} (about 8 minutes on 2 cores)")
    if march:  # -march names the target; ggml's own switches for what x86-64-v3 has
        flags = [
            "-DGGML_NATIVE=OFF",
            f"-DCMAKE_C_FLAGS=-march={march}",
            f"-DCMAKE_CXX_FLAGS=-march={march}",
            *(f"-DGGML_{isa}=ON" for isa in ("AVX", "AVX2", "FMA", "F16C", "BMI2")),
        ]
    else:
        flags = ["-DGGML_NATIVE=ON", "-DCMAKE_C_FLAGS=" + NO_AMX, "-DCMAKE_CXX_FLAGS=" + NO_AMX]
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(folder),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            *flags,
        ],
        check=True,
    )
    subprocess.run(["cmake", "--build", str(folder), "--target", *TOOLS, "-j", str(os.cpu_count() or 2)], check=True)
    return binary


# llama.cpp's converter writes the vocabulary of these architectures only as GPT-2 BPE and stops at a
# pre-tokenizer it does not know; the presets carry stories260K's sentencepiece tokenizer, which its
# sentencepiece writer (what Llama's class uses) handles, padding the vocabulary to the model's.
SENTENCEPIECE_VOCAB = ("Qwen3MoeForCausalLM",)
_CONVERT_WITH_SENTENCEPIECE = """
import runpy, sys
script, arch = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, script.rsplit("/", 1)[0])  # its own `conversion` package
converter = runpy.run_path(script, run_name="tram_convert")
converter["get_model_class"](arch).set_vocab = lambda self: self._set_vocab_sentencepiece()
converter["main"]()
"""


def converter_argv(src: Path, checkpoint: str) -> list[str]:
    """The command that runs llama.cpp's converter on `checkpoint` (its arguments follow)."""
    import json

    script = str(src / "convert_hf_to_gguf.py")
    arch = (json.loads((Path(checkpoint) / "config.json").read_text()).get("architectures") or [""])[0]
    if arch in SENTENCEPIECE_VOCAB and (Path(checkpoint) / "tokenizer.model").exists():
        return [sys.executable, "-c", _CONVERT_WITH_SENTENCEPIECE, script, arch]
    return [sys.executable, script]


def gguf_path(checkpoint: str, dtype: str) -> Path:
    return CACHE / "gguf" / f"{Path(checkpoint).name}-{dtype}.gguf"


def convert(model: str, dtype: str, seed: int) -> tuple[str, Path]:
    """(the checkpoint Tram serves, the same weights as GGUF at the same dtype)."""
    from tram.bench.presets import checkpoint_for

    checkpoint = checkpoint_for(model, dtype, seed)
    out = gguf_path(checkpoint, dtype)
    if out.exists():
        return checkpoint, out
    out.parent.mkdir(parents=True, exist_ok=True)
    src = source_dir()
    try:
        import gguf  # noqa: F401
    except ImportError:
        log("installing gguf from PyPI for the converter")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf"], check=True)
    outtype = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    log(f"converting {checkpoint} to {out} ({outtype})")
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        [*converter_argv(src, checkpoint), checkpoint, "--outtype", outtype, "--outfile", str(tmp)], check=True
    )
    tmp.rename(out)
    return checkpoint, out


def quantized(checkpoint: str, dtype: str, seed: int, gguf_type: str) -> Path:
    """The model as a GGUF file of llama.cpp type `gguf_type` (Q8_0, Q4_K_M, ...): converted at the
    checkpoint's own dtype (`dtype`; exact, and half the disk of float32 for a bfloat16 checkpoint of a
    large preset), then llama-quantize, as users make their files; cached."""
    out = gguf_path(checkpoint, gguf_type)
    if out.exists():
        return out
    _, base = convert(checkpoint, dtype, seed)
    log(f"quantizing {base} to {gguf_type}")
    tmp = out.with_suffix(".tmp")
    subprocess.run([str(tool_binary("llama-quantize")), str(base), str(tmp), gguf_type], check=True)
    tmp.rename(out)
    return out


def resident_mib(pid: int) -> float:
    """Resident set (MiB) of a process and all its descendants: the server's whole footprint."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def start_llama_server(
    binary: Path, gguf: Path, slots: int, ctx_per_slot: int, port: int, threads: int | None, log_dir: Path
) -> ServerProcess:
    argv = [
        str(binary),
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(slots),
        "-c",
        str(slots * ctx_per_slot),
        "--no-webui",
        "-a",
        "llama.cpp",
    ]
    if threads:
        argv += ["-t", str(threads), "-tb", str(threads)]
    return ServerProcess("llama-server", argv, port, log_path=log_dir / f"llama-server-np{slots}.log")


def start_tram(
    model: str,
    dtype: str | None,
    port: int,
    max_model_len: int,
    log_dir: Path,
    tokenizer: str | None = None,
    threads: int | None = None,
    extra: str = "",
) -> TramServer:
    """Tram's server; `threads` sets the engine core's model threads (TRAM_CPU_THREADS), which
    default to every core while the machine is otherwise free (one fewer while another process is
    busy), as llama-server takes them all. `extra`: more serve flags."""
    args = ["--max-model-len", str(max_model_len), "--served-model-name", "tram", *shlex.split(extra)]
    if dtype:  # None: Tram's own choice for the file, as a user starts it
        args += ["--dtype", dtype]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    env = {"TRAM_CPU_THREADS": str(threads)} if threads else None
    return TramServer(model, args, timeout=300, port=port, log_path=log_dir / "tram-serve.log", env=env)


def bench(server: ServerProcess, model: str, requests: list, concurrency: int, label: str, warmup: int) -> dict:
    import asyncio

    from tram.bench.serve import benchmark

    result = asyncio.run(
        benchmark(
            server.url, model, requests, max_concurrency=concurrency, label=label, warmup=warmup, disable_tqdm=False
        )
    )
    result["sweep"] = {"param": "concurrency", "value": concurrency}
    return result


def gguf_vocab_size(path: Path) -> int:
    """The vocabulary of a GGUF file (its token list's length), read from the metadata alone."""
    from gguf import GGUFReader

    return len(GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].data)


def served_files(args: argparse.Namespace) -> tuple[str, str | None, Path, int]:
    """(what Tram serves, its tokenizer or None, the file llama-server serves, the vocabulary size).

    --gguf: a GGUF file a user holds, served as it is by both (Tram reads its tokenizer from it).
    --gguf-type: both engines serve the same quantized file made from the preset (Tram with the
    checkpoint's tokenizer). Otherwise Tram serves the checkpoint and llama-server its conversion."""
    if args.gguf:
        path = Path(args.gguf).resolve()
        return str(path), None, path, gguf_vocab_size(path)
    from transformers import AutoConfig

    checkpoint, gguf = convert(args.model, args.dtype, args.seed)
    vocab = AutoConfig.from_pretrained(checkpoint).vocab_size
    if args.gguf_type:
        gguf = quantized(checkpoint, args.dtype, args.seed, args.gguf_type)
        return str(gguf), checkpoint, gguf, vocab
    return checkpoint, None, gguf, vocab


def compare(args: argparse.Namespace) -> None:
    from tram.bench.datasets import make_requests, parse_range
    from tram.bench.report import machine_info, write_json
    from tram.bench.sweep_plot import plot_sweep

    binary = build()
    tram_model, tram_tokenizer, gguf, vocab = served_files(args)
    levels = [int(c) for c in args.concurrency.split(",")]
    ctx = parse_range(args.input_len)[1] + parse_range(args.output_len)[1] + 16
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    # The two engines take turns level by level (llama-server restarts with -np = concurrency; Tram,
    # idle meanwhile, stays up), so each pair is measured minutes apart at most: this shared VM's
    # speed drifts by 10-20% over minutes, which made the engines measured at different times differ.
    tram = start_tram(
        tram_model,
        None if args.gguf else args.dtype,
        args.port + 1,
        ctx,
        log_dir,
        tram_tokenizer,
        args.tram_threads,
        args.tram_args,
    )
    memory = {"tram_idle_mib": resident_mib(tram.proc.pid), "file_mib": gguf.stat().st_size / 2**20}
    try:
        for conc in levels:
            # Prompts of their own per level: Tram's server stays up between levels, and with the
            # same prompts its prefix cache would skip every prefill after the first level (while
            # llama-server restarts empty), which flattered Tram's TTFT and throughput.
            requests = make_requests(
                args.num_prompts or max(4 * conc, MIN_PROMPTS),
                args.input_len,
                args.output_len,
                args.seed + conc,
                vocab_size=vocab,
            )
            llama = start_llama_server(binary, gguf, conc, ctx, args.port, args.llama_threads, log_dir)
            try:
                runs.append(bench(llama, "llama.cpp", requests, conc, "llama.cpp", args.warmup))
            finally:
                llama.stop(timeout=30, strict=False)  # a slow exit must not lose the measurements
            runs.append(bench(tram, "tram", requests, conc, "tram", args.warmup))
            memory[f"tram_after_c{conc}_mib"] = resident_mib(tram.proc.pid)
    finally:
        tram.stop(timeout=30, strict=False)
    ratios = print_serve_comparison(runs, ("tram", "llama.cpp"), lambda by, conc: by.get(("llama.cpp", conc)))
    title = Path(args.gguf).name if args.gguf else f"{args.model} {args.dtype}"
    plot_sweep(runs, args.plot, title=f"{title}: tram vs llama.cpp")
    print("resident set (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    write_json(
        args.output_json,
        {
            "model": args.gguf or args.model,
            "dtype": args.dtype,
            "gguf_type": args.gguf_type,
            "tram_args": args.tram_args,
            "machine": machine_info(),
            "memory": memory,
            "ratios": ratios,
            "runs": runs,
        },
    )
    print(f"wrote {args.output_json} and {args.plot}")


def prefill(args: argparse.Namespace) -> None:
    """Time to first token on llama-server beside Tram (and vLLM) with `tram bench latency --prefill`:
    llama-server serves the same file with a slot per prompt of the largest batch, at --threads."""
    from tram.bench.latency import add_latency_args, run_latency
    from tram.bench.prefill import parse_workloads

    binary = build()
    checkpoint, gguf = convert(args.model, args.dtype, args.seed)
    tram_model = checkpoint
    if args.gguf_type:  # Tram loads the same quantized file
        gguf = tram_model = quantized(checkpoint, args.dtype, args.seed, args.gguf_type)
    workloads = parse_workloads(args.workloads)
    slots, ctx = max(w.batch for w in workloads), max(w.prompt_len for w in workloads) + 16
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    llama = start_llama_server(binary, gguf, slots, ctx, args.port, args.threads, log_dir)
    latency = argparse.ArgumentParser()
    add_latency_args(latency)
    flags = ["--model", str(tram_model), "--dtype", args.dtype, "--threads", str(args.threads), "--prefill"]
    flags += ["--workloads", args.workloads, "--backend", args.backend, "--llama-server-url", llama.url]
    flags += ["--output-json", args.output_json, *shlex.split(args.latency_args)]
    try:
        run_latency(latency.parse_args(flags))
    finally:
        llama.stop(timeout=30, strict=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    for name in ("convert", "compare"):
        p = sub.add_parser(name)
        p.add_argument("--model", default="llama-15m", help="a preset name or a model folder")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        p.add_argument("--seed", type=int, default=0)
    cmp = sub.choices["compare"]
    cmp.add_argument(
        "--gguf-type",
        help="serve this llama-quantize type (Q8_0, Q4_K_M, ...) on both sides: "
        "Tram loads the same GGUF file as llama-server",
    )
    sub.choices["convert"].add_argument("--gguf-type", help="also quantize to this llama-quantize type")
    cmp.add_argument(
        "--gguf", help="a GGUF file both serve as it is (e.g. a downloaded model; --model and --dtype then unused)"
    )
    cmp.add_argument("--concurrency", default="1,16,64")
    cmp.add_argument("--num-prompts", type=int, help=f"per level (default: 4 x concurrency, at least {MIN_PROMPTS})")
    cmp.add_argument("--input-len", default="32:512")
    cmp.add_argument("--output-len", default="16:256")
    cmp.add_argument("--warmup", type=int, default=2)
    cmp.add_argument("--port", type=int, default=8411)
    cmp.add_argument("--llama-threads", type=int, help="llama-server -t/-tb (default: its own choice)")
    cmp.add_argument(
        "--tram-threads",
        type=int,
        help="the engine core's model threads (default: Tram's own "
        "choice: every core while no other process is busy, one fewer while one is)",
    )
    cmp.add_argument(
        "--tram-args", default="", help="more `tram serve` flags, one string (e.g. '--gguf-activations int8')"
    )
    cmp.add_argument("--log-dir", default=str(CACHE / "logs"))
    cmp.add_argument("--plot", default="llama_cpp_compare.png")
    cmp.add_argument("--output-json", default="llama_cpp_compare.json")
    pre = sub.add_parser("prefill", help="time to first token: llama-server beside Tram (and vLLM)")
    pre.add_argument("--model", default="qwen2.5-0.5b", help="a preset name or a model folder")
    pre.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--gguf-type", help="both serve this llama-quantize type (Q4_K_M, ...) from the same file")
    pre.add_argument("--workloads", default="1x2048,16x512", help="BxL: B prompts of L tokens at once")
    pre.add_argument(
        "--backend", default="tram,llama-server", help="`tram bench latency --prefill` backends (add vllm)"
    )
    pre.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="every engine's threads")
    pre.add_argument("--port", type=int, default=8411)
    pre.add_argument("--latency-args", default="", help="more `tram bench latency` flags, one string")
    pre.add_argument("--log-dir", default=str(CACHE / "logs"))
    pre.add_argument("--output-json", default="prefill_compare.json")
    args = parser.parse_args()
    if args.cmd == "build":
        print(build())
    elif args.cmd == "convert":
        checkpoint, path = convert(args.model, args.dtype, args.seed)
        if args.gguf_type:
            build()  # llama-quantize
            path = quantized(checkpoint, args.dtype, args.seed, args.gguf_type)
        print(path)
    elif args.cmd == "prefill":
        prefill(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
