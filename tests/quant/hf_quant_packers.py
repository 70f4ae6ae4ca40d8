"""Test helpers: quantize a float Llama's linears and save them the way GPTQ (AutoGPTQ / GPTQModel), AWQ
(AutoAWQ GEMM) and compressed-tensors (llm-compressor) do, written from those formats' packing code,
not from Tram's reader. Each writer also returns the dequantized float weights, (q - z) * s in
float32 from the stored scales: what the quantized checkpoint means, and what Tram must compute.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Quantized:
    """Integer weight of one layer: q [N, K] in 0..(2^bits - 1), zero and fp16/bf16 scale [N, G], g_idx [K]."""

    q: torch.Tensor
    zero: torch.Tensor
    scale: torch.Tensor
    g_idx: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        cols = self.g_idx.long()
        return (self.q.float() - self.zero.float()[:, cols]) * self.scale.float()[:, cols]


def quantize(
    w: torch.Tensor,
    group: int,
    sym: bool,
    act_order: bool,
    bits: int = 4,
    seed: int = 0,
    scale_dtype: torch.dtype = torch.float16,
) -> Quantized:
    """Round-to-nearest min-max quantization per group of input columns (GPTQ's `Quantizer` grid: sym
    puts the zero at 2^(bits-1)); act_order assigns columns to groups in a random order, as GPTQ's
    desc_act does by Hessian diagonal."""
    n, k = w.shape
    group = k if group <= 0 else group
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if act_order else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    groups, maxq = (k + group - 1) // group, 2**bits - 1
    q = torch.empty(n, k, dtype=torch.int64)
    zero = torch.empty(n, groups, dtype=torch.int64)
    scale = torch.empty(n, groups)
    for g in range(groups):
        cols = (g_idx == g).nonzero().flatten()
        wg = w[:, cols]
        lo, hi = wg.amin(1).clamp(max=0), wg.amax(1).clamp(min=0)
        if sym:
            s = (torch.maximum(-lo, hi) * 2 / maxq).to(scale_dtype).float()
            z = torch.full((n,), (maxq + 1) // 2, dtype=torch.int64)
        else:
            s = ((hi - lo) / maxq).to(scale_dtype).float()
            z = torch.round(-lo / s).long().clamp(1, maxq)  # >= 1: AutoGPTQ's v1 packing stores z - 1
        q[:, cols] = torch.clamp(torch.round(wg / s[:, None]) + z[:, None], 0, maxq).long()
        zero[:, g], scale[:, g] = z, s
    return Quantized(q, zero, scale.to(scale_dtype), g_idx)


def _int32(words: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(values: torch.Tensor, order: list[int] | None = None, bits: int = 4) -> torch.Tensor:
    """Pack along dim 1: word c of a row holds columns c*p .. c*p + p - 1 (p = 32 / bits), value i at
    bits*i being column order[i] of the run (AutoAWQ) or column i (AutoGPTQ, compressed-tensors);
    padded with zeros to a whole word, as compressed-tensors' pack_to_int32 pads."""
    per = 32 // bits
    rows, cols = values.shape
    padded = torch.zeros(rows, -(-cols // per) * per, dtype=torch.int64)
    padded[:, :cols] = values.long()
    runs = padded.view(rows, -1, per)
    if order is not None:
        runs = runs[..., order]
    shifts = torch.arange(per, dtype=torch.int64) * bits
    return _int32((runs << shifts).sum(-1))


def gptq_tensors(qw: Quantized, v2: bool = False) -> dict[str, torch.Tensor]:
    """AutoGPTQ's QuantLinear.pack: qweight [K / 8, N] packed along K; qzeros [G, N / 8] holding z - 1
    (v1; v2 holds z); scales [G, N]; g_idx [K]."""
    stored_zero = qw.zero if v2 else (qw.zero - 1) & 15
    return {
        "qweight": pack_rows(qw.q).t().contiguous(),
        "qzeros": pack_rows(stored_zero.t()),
        "scales": qw.scale.t().contiguous(),
        "g_idx": qw.g_idx,
    }


def awq_tensors(qw: Quantized) -> dict[str, torch.Tensor]:
    """AutoAWQ's WQLinear_GEMM.from_linear: qweight [K, N / 8] and qzeros [G, N / 8] packed along N in
    the order 0, 2, 4, 6, 1, 3, 5, 7; scales [G, N]."""
    return {
        "qweight": pack_rows(qw.q.t(), AWQ_ORDER),
        "qzeros": pack_rows(qw.zero.t(), AWQ_ORDER),
        "scales": qw.scale.t().contiguous(),
    }


def compressed_tensors(qw: Quantized, bits: int, sym: bool, act_order: bool = False) -> dict[str, torch.Tensor]:
    """compressed-tensors' pack-quantized (pack_to_int32 of the signed values + 2^(bits-1)) for 4 bits,
    int-quantized (the int8 weight) for 8."""
    n, k = qw.q.shape
    half = 2 ** (bits - 1)
    out = {"weight_scale": qw.scale.contiguous()}
    if bits == 8:
        out["weight"] = (qw.q - half).to(torch.int8)
        return out
    out["weight_packed"] = pack_rows(qw.q)  # q + 8 of the signed value is the unsigned q itself
    out["weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
    if not sym:
        out["weight_zero_point"] = pack_rows(qw.zero.t()).t().contiguous()  # packed along N (dim 0)
    if act_order:
        out["weight_g_idx"] = qw.g_idx
    return out


Writer = Callable[[torch.Tensor, int], tuple[dict[str, torch.Tensor], torch.Tensor]]


def write_quantized(float_dir: str, out_dir: str, quantization_config: dict, writer: Writer) -> str:
    """Copy float_dir to out_dir with every decoder linear quantized by `writer(weight, index)` ->
    (its tensors by suffix, its dequantized weight); return the folder of a float checkpoint holding
    the dequantized weights (the oracle's), out_dir + "-dequantized"."""
    oracle_dir = out_dir + "-dequantized"
    shutil.copytree(float_dir, out_dir)
    shutil.copytree(float_dir, oracle_dir)
    tensors = load_file(os.path.join(float_dir, "model.safetensors"))
    quantized, dequantized = {}, dict(tensors)
    for i, (name, w) in enumerate(sorted(tensors.items())):
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS:
            parts, dq = writer(w, i)
            quantized.update({f"{prefix}.{suffix}": t for suffix, t in parts.items()})
            dequantized[name] = dq
        else:
            quantized[name] = w
    save_file(quantized, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, os.path.join(oracle_dir, "model.safetensors"), metadata={"format": "pt"})
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["quantization_config"] = quantization_config
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return oracle_dir
