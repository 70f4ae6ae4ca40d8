"""AWQ 4-bit GEMM checkpoints (AutoAWQ).

w[n, k] = (q[n, k] - z[n, g(k)]) * s[n, g(k)]: qweight [K, N / 8] and qzeros [G, N / 8] packed eight
to an int32 along N in the order 0, 2, 4, 6, 1, 3, 5, 7 (4-bit value i of a word, at bits 4i, is
column AWQ_ORDER[i] of its eight); scales [G, N]. Always asymmetric, never act-order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tram.model.quant.formats.base import CheckpointFormat, LayerScheme, SchemeGroups
from tram.model.quant.formats.registry import register, unsupported

if TYPE_CHECKING:
    from tram.model.quant.unpacked import Int4Parts, Parts

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@register
class AWQ(CheckpointFormat):
    name = "AWQ"
    methods = ("awq",)
    supported = "AWQ 4-bit GEMM"
    tensors = ("qweight", "qzeros", "scales")
    marker = "qweight"

    def parse(self, config: dict[str, Any]) -> SchemeGroups:
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits != 4:
            raise unsupported(f"AWQ {bits}-bit")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise unsupported(f"AWQ {version.upper()}")
        if not config.get("zero_point", True):
            raise unsupported("AWQ without zero points (zero_point false)")
        return [((), LayerScheme(4, int(config.get("group_size", config.get("q_group_size", 128))), False))]

    def unpack(self, scheme: LayerScheme, parts: Parts) -> Int4Parts:
        from tram.model.quant.unpacked import Int4Parts, unpack_int32  # torch: only when a checkpoint loads

        q = unpack_int32(parts["qweight"], dim=1, order=AWQ_ORDER).t()  # [N, K]
        zero = unpack_int32(parts["qzeros"], dim=1, order=AWQ_ORDER).t()  # [N, G]
        group = q.shape[1] if scheme.group_size <= 0 else scheme.group_size
        return Int4Parts(q, parts["scales"].t(), zero, group)
