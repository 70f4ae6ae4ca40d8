"""Micro-benchmark: CPU decode attention, C++ paged kernel vs the gather + masked SDPA path.

The SDPA path is TorchAttentionBackend._decode_sdpa (what _decode runs where the kernel does not),
fed a hand-made step plan (as _plan builds it); the kernel is
tram.model.kernels.cpu_kernels.paged_decode_attention. One call = one layer's decode attention for
the whole batch. Each time is the minimum over several repeats, since the machine may be shared.

    python benchmarks/cpu_decode_attention.py [--batches 32 256] [--threads 1 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch

from tram.bench.report import machine_summary
from tram.bench.timing import best_ms
from tram.model.attention.torch_backend import TorchAttentionBackend, _StepPlan
from tram.model.kernels.cpu_kernels import load_cpu_kernels, paged_decode_attention

SHAPES = {"15M": (6, 6, 48), "110M": (12, 12, 64)}  # name -> (H, Hkv, D)
BLOCK = 16


def make_inputs(
    batch: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = random.Random(seed)
    lens = [rng.randint(32, 768) for _ in range(batch)]
    nblk = [-(-n // BLOCK) for n in lens]
    width = max(nblk)
    ids = list(range(sum(nblk)))
    rng.shuffle(ids)  # requests' blocks scattered over the cache
    tables = torch.zeros(batch, width, dtype=torch.int32)
    pos = 0
    for i, nb in enumerate(nblk):
        tables[i, :nb] = torch.tensor(ids[pos : pos + nb], dtype=torch.int32)
        pos += nb
    cache = torch.randn(2, sum(nblk), BLOCK, kv_heads, head_dim).to(dtype)
    query = torch.randn(batch, heads, head_dim).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.long)
    return query, cache, tables, seq_lens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    assert load_cpu_kernels() is not None, "kernel failed to build"
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    backend = TorchAttentionBackend()

    print(machine_summary() + " (threads set per row below)\n")
    print("| shape | dtype | B | threads | gather+SDPA ms | kernel ms | speed-up | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        heads, kv_heads, head_dim = SHAPES[shape]
        scale = head_dim**-0.5
        for dname in args.dtypes:
            for batch in args.batches:
                query, cache, tables, seq_lens = make_inputs(batch, heads, kv_heads, head_dim, dtypes[dname])
                plan = _StepPlan(batch, slice(0, batch), tables, seq_lens, tables.shape[1] * BLOCK, [])

                def sdpa() -> torch.Tensor:
                    plan.decode_masks.clear()  # a fresh mask per step, shared by the layers: cost ~1/L
                    return backend._decode_sdpa(query, cache, plan, scale, None)

                def kernel() -> torch.Tensor:
                    return paged_decode_attention(query, cache, tables, seq_lens, scale, None)

                for threads in args.threads:
                    torch.set_num_threads(threads)
                    diff = (sdpa().float() - kernel().float()).abs().max().item()
                    calls = max(1, 64 // batch)
                    t_sdpa = best_ms(sdpa, args.repeats, calls)
                    t_kernel = best_ms(kernel, args.repeats, calls)
                    print(
                        f"| {shape} H={heads} D={head_dim} | {dname} | {batch} | {threads} | {t_sdpa:.2f} | "
                        f"{t_kernel:.2f} | {t_sdpa / t_kernel:.1f}x | {diff:.1e} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
