"""What every section of the GPU benchmark shares: its context, device helpers, the model under test
(a `tram.bench` preset with dummy weights), and the measured ceilings (copy bandwidth, matmul rate)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tram.bench.datasets import BenchRequest, random_requests
from tram.bench.presets import preset_names, resolve_model
from tram.bench.timing import median_ms

GOALS = {
    "decode_ratio_max": 1.3,
    "decode_goal_min_batch": 64,
    "throughput_output_tok_per_s": 12_500,
    "throughput_ratio_vs_hf": 3.0,
}
# Names this script accepted before it used tram's presets.
PRESET_ALIASES = {"llama3-8b": "llama-3-8b"}
# --smoke's model: the Llama-3-8B preset shrunk. Head dim 32 (not 16) so that the Triton kernels see
# a shape their tl.dot tiles accept.
TINY_BASE = "llama-3-8b"
TINY: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    max_position_embeddings=512,
)
# Ids 0-2 are special in Llama-style vocabularies (unk/bos/eos, or bos/eos/pad): never drawn.
SPECIAL_IDS = range(3)


def log(msg: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Ctx:
    """What a section needs: parsed flags, the device, and a way to save partial results."""

    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype
    save: Callable[[], None]


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def preset_choices() -> list[str]:
    return sorted([*preset_names(), "tiny", *PRESET_ALIASES])


def resolve_bench_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "none"
    if name == "none" or (name == "cuda" and not torch.cuda.is_available()):
        raise RuntimeError("no CUDA device: run on a GPU machine, or pass --smoke (or --device cpu)")
    return torch.device(name)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def fixed_requests(num: int, input_len: int, output_len: int, vocab_size: int, seed: int) -> list[BenchRequest]:
    """`num` requests of exactly input_len random prompt tokens and output_len output tokens."""
    return random_requests(num, (input_len, input_len), (output_len, output_len), vocab_size, seed, SPECIAL_IDS)


# ---------------------------------------------------------------------------------------------
# The model under test
# ---------------------------------------------------------------------------------------------
def hf_config(args: argparse.Namespace) -> Any:
    """The preset's transformers config at --dtype ('tiny': the TINY shape over TINY_BASE's)."""
    from transformers import AutoConfig

    name = PRESET_ALIASES.get(args.preset, args.preset)
    cfg = AutoConfig.from_pretrained(resolve_model(TINY_BASE if name == "tiny" else name))
    if name == "tiny":
        cfg.update(TINY)
    cfg.dtype = args.dtype
    return cfg


def head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


@contextlib.contextmanager
def model_dir(args: argparse.Namespace) -> Iterator[str]:
    """A folder with only config.json: Tram loads dummy weights and skips the tokenizer."""
    with tempfile.TemporaryDirectory(prefix="tram-bench-") as path:
        hf_config(args).save_pretrained(path)
        yield path


def make_llm(ctx: Ctx, path: str, max_num_seqs: int, max_model_len: int) -> Any:
    from tram import LLM

    args = ctx.args
    kwargs: dict[str, Any] = dict(
        load_format="dummy",
        dtype=args.dtype,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        block_size=args.block_size,
        seed=args.seed,
        device=ctx.device.type,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    if args.attention_backend:
        kwargs["attention_backend"] = args.attention_backend
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    return LLM(path, **kwargs)


def engine_summary(llm: Any) -> dict[str, Any]:
    cfg = llm.llm_engine.engine_core.config
    graphs = getattr(llm.llm_engine.engine_core.model_runner, "graph_runner", None)
    return {
        "attention_backend": cfg.model_config.attention_backend,
        "enforce_eager": getattr(cfg.model_config, "enforce_eager", None),
        "num_kv_blocks": cfg.cache_config.num_blocks,
        "block_size": cfg.cache_config.block_size,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "decode_graph_sizes": list(graphs.sizes) if graphs is not None else None,
    }


# ---------------------------------------------------------------------------------------------
# Measured ceilings
# ---------------------------------------------------------------------------------------------
def measure_copy_bandwidth(device: torch.device, mib: int) -> dict[str, float]:
    """Device-to-device copy of `mib` MiB; bytes read plus bytes written over the median time."""
    numel = mib * 2**20 // 2
    src = torch.randn(numel, dtype=torch.bfloat16, device=device)  # random, never zeros (METHOD.md)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device)
    assert torch.equal(dst, src), "copy check failed"
    moved = 2 * src.numel() * src.element_size()
    src = dst = None  # drop the buffers before free_memory (the lambda held them)
    free_memory(device)
    return {"copy_bytes": moved // 2, "copy_ms": ms, "bandwidth_GBps": moved / (ms * 1e-3) / 1e9}


def measure_matmul_rate(device: torch.device, dtype: torch.dtype, n: int) -> dict[str, float]:
    """Square matmul through torch (cuBLAS on CUDA): the practical ceiling for the model's GEMMs."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    ms = median_ms(lambda: a @ b, device)
    a = b = None  # as above
    free_memory(device)
    return {"matmul_n": n, "matmul_ms": ms, "matmul_TFLOPs": 2 * n**3 / (ms * 1e-3) / 1e12}
