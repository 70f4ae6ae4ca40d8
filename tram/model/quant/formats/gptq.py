"""GPTQ (AutoGPTQ / GPTQModel) 4-bit checkpoints.

w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)], 4-bit values packed eight to an int32 (value i of a
word at bits 4i): qweight [K / 8, N] packed along K; qzeros [G, N / 8] along N; scales [G, N];
g_idx [K], the group of each input column (act-order, desc_act, when not k // group). The classic
format ("gptq", v1) stores z - 1 in qzeros; "gptq_v2" stores z.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tram.model.quant.formats.base import CheckpointFormat, LayerScheme, SchemeGroups
from tram.model.quant.formats.registry import register, unsupported

if TYPE_CHECKING:
    from tram.model.quant.unpacked import Int4Parts, Parts


@dataclass(frozen=True)
class GPTQScheme(LayerScheme):
    """GPTQ's layer scheme, with its zero-point convention: v1 stores z - 1."""

    v1: bool = True


@register
class GPTQ(CheckpointFormat):
    name = "GPTQ"
    methods = ("gptq",)
    supported = "GPTQ 4-bit (group or per-channel, desc_act false or true, sym or asym; gptq or gptq_v2 format)"
    tensors = ("qweight", "qzeros", "scales", "g_idx")
    marker = "qweight"

    def parse(self, config: dict[str, Any]) -> SchemeGroups:
        bits = int(config.get("bits", 4))
        if bits != 4:
            raise unsupported(f"GPTQ {bits}-bit")
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise unsupported(f"GPTQ checkpoint_format {fmt!r}")
        if config.get("lm_head"):
            raise unsupported("GPTQ with a quantized lm_head")
        if config.get("dynamic"):
            raise unsupported("GPTQ with per-module overrides (dynamic)")
        return [((), GPTQScheme(4, int(config.get("group_size", 128)), bool(config.get("sym", True)), fmt == "gptq"))]

    def unpack(self, scheme: GPTQScheme, parts: Parts) -> Int4Parts:
        from tram.model.quant.unpacked import Int4Parts, unpack_int32  # torch: only when a checkpoint loads

        q = unpack_int32(parts["qweight"], dim=0).t()  # [N, K]
        n, k = q.shape
        zero = unpack_int32(parts["qzeros"], dim=1)[:, :n]  # [G, N]
        if scheme.v1:
            zero = (zero + 1) & 15  # v1 stores z - 1 (the classic off-by-one, kept for compatibility)
        group = k if scheme.group_size <= 0 else scheme.group_size
        return Int4Parts(q, parts["scales"].t(), zero.t(), group, parts.get("g_idx"))
