"""Section `quant`: Tram's Triton weight-only GEMMs (tram/model/quant/triton_linear.py: W8A16 int8 per
output channel, W4A16 int4 in groups of 128) against F.linear in --dtype (cuBLAS on a GPU) on the
preset's linear shapes as the engine runs them (q/k/v/o, gate/up, down: separate calls), at several
row counts (decode batches to prefill chunks). Per row: the time of each, the weight bytes each reads
(float: the matrix; quantized: packed bytes + scales) over the measured copy bandwidth, and a
correctness check of each quantized result against the float32 dequantize-then-matmul reference."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from tram.bench.timing import median_ms, sync

from gpu.common import Ctx, free_memory, head_dim, hf_config, log, measure_copy_bandwidth, parse_ints  # isort: skip

# ‖y − ref‖ / ‖ref‖ of a quantized GEMM against reference_linear in float32 on the same quantized
# weights. In bf16 the output is rounded once (unit roundoff 2^-8; ~1.7e-3 norm-wise on random data)
# and int4 weights are rounded to bf16 before tl.dot ((q - 8) * scale: ~2.3e-3 with the output
# rounding); int8 weights are exact integers in bf16, and fp32 sums in another order add ~1e-6. Under
# TRITON_INTERPRET the fp32 -> bf16 cast truncates instead of rounding to nearest: ~3.3e-3. fp16 is 8x
# tighter. Simulated on these shapes, swapped nibbles or a neighbouring group's scale give 0.15 to
# 1.4, one zeroed 32-column tile of 4096 columns 0.09: 1e-2 sits 3x above the rounding, 9x below those.
QUANT_REL_TOL = 1e-2
KERNELS = ("float", "int8", "int4")


@dataclass
class LinearShape:
    """One weight shape [N, K] of a decoder layer; `names` are the layer's linears of that shape."""

    names: tuple[str, ...]
    out_features: int  # N
    in_features: int  # K

    @property
    def label(self) -> str:
        return "/".join(self.names)


def model_shapes(cfg: Any) -> list[LinearShape]:
    """The preset's linear shapes, one entry per distinct [N, K] (Llama-3-8B: q/o 4096x4096, k/v
    1024x4096, gate/up 14336x4096, down 4096x14336)."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * head_dim(cfg), cfg.num_key_value_heads * head_dim(cfg)
    linears = [
        ("q_proj", q, hidden),
        ("k_proj", kv, hidden),
        ("v_proj", kv, hidden),
        ("o_proj", hidden, q),
        ("gate_proj", inter, hidden),
        ("up_proj", inter, hidden),
        ("down_proj", hidden, inter),
    ]
    by_shape: dict[tuple[int, int], list[str]] = {}
    for name, n, k in linears:
        by_shape.setdefault((n, k), []).append(name)
    return [LinearShape(tuple(names), n, k) for (n, k), names in by_shape.items()]


def parse_shapes(text: str) -> list[LinearShape]:
    """--quant-shapes 'NxK,...' (out x in features): shapes of no model, one linear each."""
    shapes = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        n, k = (int(v) for v in item.lower().split("x"))
        shapes.append(LinearShape((item,), n, k))
    return shapes


def weight_bytes(qw: Any) -> int:
    """What the quantized GEMM must read of W: packed values, scales (and zero points, if any)."""
    parts = [qw.qweight, qw.scale] + ([qw.zero] if qw.zero is not None else [])
    return sum(t.numel() * t.element_size() for t in parts)


@contextlib.contextmanager
def exact_fp32_matmul() -> Iterator[None]:
    """The reference in true fp32: TF32 (if anything enabled it) would add ~1e-3 of its own error."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def check(out: torch.Tensor, x: torch.Tensor, qw: Any) -> dict[str, Any]:
    """out against reference_linear on float32 x (exact from bf16/fp16), unrounded."""
    from tram.model.quant.weights import reference_linear

    with exact_fp32_matmul():
        ref = reference_linear(x.float(), qw, None)
    finite = bool(torch.isfinite(out).all())  # an overflow, or an unwritten tile over NaN garbage
    err = float((out.float() - ref).norm() / ref.norm())
    return {"rel_err": err, "finite": finite, "correct": finite and err < QUANT_REL_TOL}


def timed(ctx: Ctx, fn: Callable[[], torch.Tensor], nbytes: int, flops: int, bandwidth: float) -> dict[str, Any]:
    ms = median_ms(fn, ctx.device, ctx.args.kernel_warmup, ctx.args.kernel_iters)
    return {
        "ms": ms,
        "weight_bytes": nbytes,
        "GBps": nbytes / (ms * 1e-3) / 1e9,
        "fraction_of_copy_bw": nbytes / (ms * 1e-3) / bandwidth,
        "TFLOPs": flops / (ms * 1e-3) / 1e12,
    }


def quant_row(
    ctx: Ctx, s: LinearShape, w: torch.Tensor, qws: dict[str, Any], rows: int, bandwidth: float
) -> dict[str, Any]:
    """F.linear and each quantized GEMM on one random x of `rows` rows."""
    from tram.model.quant.triton_linear import quant_linear_config, triton_quant_linear

    x = torch.randn(rows, s.in_features, dtype=ctx.dtype, device=ctx.device)
    calls = {name: partial(triton_quant_linear, x, qw.qweight, qw.scale, qw.group) for name, qw in qws.items()}
    # Checked before anything is timed at this size, every output alive until all are checked: the
    # output is torch.empty, so a tile a kernel leaves unwritten holds a recycled block's values, which
    # must not be this problem's from a timed call (F.linear's would pass for int8's).
    outs = {name: call() for name, call in calls.items()}  # the first calls also compile
    sync(ctx.device)
    checks = {name: check(outs[name], x, qws[name]) for name in outs}
    del outs
    flops = 2 * rows * s.out_features * s.in_features
    row: dict[str, Any] = {"shape": s.label, "N": s.out_features, "K": s.in_features, "rows": rows}
    row["float"] = timed(ctx, lambda: F.linear(x, w), w.numel() * w.element_size(), flops, bandwidth)
    for name, qw in qws.items():
        entry = row[name] = {
            "group": qw.group,
            "config": list(quant_linear_config(rows, qw.group)),
            **checks[name],
            **timed(ctx, calls[name], weight_bytes(qw), flops, bandwidth),
        }
        entry["speedup_vs_float"] = row["float"]["ms"] / entry["ms"]
    return row


def quantized(w: torch.Tensor) -> dict[str, Any]:
    """int8 per channel, and int4 at the group Tram picks for this K (128 where K allows, as on every
    preset); none where no supported group divides K."""
    from tram.model.quant.weights import Int4Weight, Int8Weight, int4_group_size

    qws: dict[str, Any] = {"int8": Int8Weight(w)}
    group = int4_group_size(w.shape[1])
    if group is not None:
        qws["int4"] = Int4Weight(w, group)
    return qws


def layer_totals(rows_out: list[dict[str, Any]], shapes: list[LinearShape], rows: list[int]) -> list[dict[str, Any]]:
    """One decoder layer's linears (each shape times its number of linears) per row count: what a
    model step would gain from each format."""
    count = {s.label: len(s.names) for s in shapes}
    totals = []
    for r in rows:
        mine = [row for row in rows_out if row["rows"] == r]
        entry: dict[str, Any] = {"rows": r}
        for name in KERNELS:
            if all(name in row for row in mine):
                entry[f"{name}_ms"] = sum(row[name]["ms"] * count[row["shape"]] for row in mine)
        for name in KERNELS[1:]:
            if f"{name}_ms" in entry:
                entry[f"{name}_speedup_vs_float"] = entry["float_ms"] / entry[f"{name}_ms"]
        totals.append(entry)
    return totals


def run_quant(ctx: Ctx, results: dict[str, Any]) -> None:
    args = ctx.args
    shapes = parse_shapes(args.quant_shapes) if args.quant_shapes else model_shapes(hf_config(args))
    rows = parse_ints(args.quant_rows)
    results["setup"] = {
        "dtype": str(ctx.dtype).removeprefix("torch."),
        "rows": rows,
        "shapes": [[s.label, s.out_features, s.in_features] for s in shapes],
        "from_preset": not args.quant_shapes,
        "rel_tol": QUANT_REL_TOL,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    results["copy"] = measure_copy_bandwidth(ctx.device, args.copy_mib)
    bandwidth = results["copy"]["bandwidth_GBps"] * 1e9
    results["rows"] = []
    for s in shapes:
        # Scaled as a trained layer's (|y| ~ |x|), so that the tolerance's bf16 analysis holds.
        w = torch.randn(s.out_features, s.in_features, device=ctx.device).mul_(s.in_features**-0.5).to(ctx.dtype)
        qws = quantized(w)
        for r in rows:
            log(f"quant: {s.label} [{s.out_features}, {s.in_features}], {r} rows")
            results["rows"].append(quant_row(ctx, s, w, qws, r, bandwidth))
        del w, qws
        free_memory(ctx.device)
        ctx.save()
    if not args.quant_shapes:
        results["layer"] = layer_totals(results["rows"], shapes, rows)
    results["all_correct"] = all(row[k]["correct"] for row in results["rows"] for k in KERNELS[1:] if k in row)
