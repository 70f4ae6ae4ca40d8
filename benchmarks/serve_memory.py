"""Resident memory of `tram serve` on a ~100 MB GGUF file with default flags, at start and after a few
requests, beside llama-server on the same file (16k context) when it is built.

The file: a random-weight model of SmolLM2-135M's shape (30 layers, 576 wide, 3 KV heads, 8192
positions; the bench presets' 32k tokenizer) converted by llama.cpp's converter and quantized to
Q4_K_M, cached under TRAM_LLAMA_CPP_CACHE. Memory is VmRSS summed over the server's process tree.

    python3 benchmarks/serve_memory.py [--llama-server]

For before/after numbers on the same file, run it with PYTHONPATH=<a `git worktree` of an older
commit>: the server then runs from that checkout (TramServer starts it in the imported tram's folder).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from llama_cpp_peer import CACHE, build_dir, gguf_path, quantized, resident_mib, start_llama_server

import tram
from tram.bench.presets import PRESETS_DIR
from tram.bench.report import machine_summary
from tram.bench.server_process import ServerProcess, TramServer, free_port

# The checkpoint; llama_cpp_peer names its Q4_K_M file after it (smollm2-135m-shape-Q4_K_M.gguf).
CHECKPOINT = CACHE / "checkpoints" / "smollm2-135m-shape"


def build_checkpoint() -> None:
    import shutil

    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    tmp = CHECKPOINT.with_suffix(".tmp")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
    for item in (PRESETS_DIR / "tokenizer").iterdir():
        shutil.copy(item, tmp / item.name)
    tmp.rename(CHECKPOINT)


def build_gguf() -> Path:
    """The file as users make theirs (converted at float32, then llama-quantize), via the peer's cache."""
    if not gguf_path(str(CHECKPOINT), "Q4_K_M").exists() and not CHECKPOINT.exists():
        build_checkpoint()
    return quantized(str(CHECKPOINT), "float32", 0, "Q4_K_M")


def complete(port: int, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 32}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def measure(server: ServerProcess, model: str) -> tuple[float, float]:
    """(MiB at start, MiB after four requests) of the server's process tree."""
    time.sleep(1.0)
    start = resident_mib(server.proc.pid)
    for _ in range(4):
        complete(server.port, model)
    return start, resident_mib(server.proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", action="store_true", help="also measure llama-server (-c 16384)")
    args = parser.parse_args()
    gguf = build_gguf()
    print(machine_summary())
    print(f"model: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)")
    with tempfile.TemporaryDirectory() as logs:
        server = TramServer(str(gguf), ["--served-model-name", "tram"], timeout=300)
        try:
            start, after = measure(server, "tram")
        finally:
            server.stop()
        label = f"tram serve ({Path(tram.__file__).parent.parent})"
        print(f"{label}: {start:.0f} MiB at start, {after:.0f} MiB after 4 requests")
        if args.llama_server and (build_dir() / "bin" / "llama-server").exists():
            peer = start_llama_server(
                build_dir() / "bin" / "llama-server", gguf, 1, 16384, free_port(), None, Path(logs)
            )
            try:
                start, after = measure(peer, "llama.cpp")
            finally:
                peer.stop()
            print(f"llama-server -c 16384: {start:.0f} MiB at start, {after:.0f} MiB after 4 requests")


if __name__ == "__main__":
    main()
