"""The gated MLP of Llama-style decoders: down(act(gate(x)) * up(x)), activation chosen by config."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from tram.distributed import get_tp, shard_range
from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.layers.activation import get_activation
from tram.model.layers.cpu_packed import DecodePairs, PackFn, packed_linear
from tram.model.layers.linear import Linear, linear_n, pack_stacked, takes_packed
from tram.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear

# A long prefill runs the packed MLP in row chunks whose [rows, 2I] gate/up output stays under this
# size: glibc hands out bigger blocks as fresh mmap'd pages (and never from a thread's arena), so
# every step paid for faulting in the gate/up output and the activation anew; chunks reuse freed
# heap memory that is still mapped. A row's result does not depend on the chunk it is in.
MLP_CHUNK_BYTES = 16 << 20
MIN_CHUNK_ROWS = 256


def chunk_rows(width: int, element_size: int) -> int:
    """Rows per chunk of a packed MLP whose gate/up output is `width` elements wide."""
    return max(MIN_CHUNK_ROWS, MLP_CHUNK_BYTES // (width * element_size) // 64 * 64)


class GatedMLP(nn.Module):
    """SwiGLU with silu (Llama, Qwen), GeGLU with gelu_pytorch_tanh (Gemma).

    Under tensor parallelism each rank holds intermediate_size / tp channels: gate and up are
    column-parallel, down row-parallel (one all-reduce)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool, dtype: torch.dtype
    ) -> None:
        super().__init__()
        tp = get_tp()
        start, size = shard_range(intermediate_size, tp.rank, tp.size)
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, start, size, bias=bias, dtype=dtype)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, start, size, bias=bias, dtype=dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, start, size, bias=bias, dtype=dtype)
        self.act = get_activation(hidden_act)
        self.fused_silu = hidden_act in ("silu", "swish")
        # On CPU, gate's and up's weights stacked [2I, hidden] and packed for oneDNN (pack_stacked): one
        # GEMM for both, whose [T, 2I] output the fused silu_and_mul kernel reads in one pass.
        self.packed_gate_up: torch.Tensor | DecodePairs | None = None
        self.gate_up_bias: torch.Tensor | None = None

    def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = packed_linear(x, self.packed_gate_up, self.gate_up_bias)  # [T, 2I]
        kernels = kernels_for(x) if self.fused_silu else None
        if kernels is not None:
            return self.down_proj(kernels.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)

    def stacked_linears(self) -> tuple[Linear, Linear]:
        return self.gate_proj, self.up_proj

    def pack_stacked(self, pack: PackFn) -> torch.Tensor | DecodePairs | None:
        """Packs gate and up as one weight; returns the packed tensor (None where it cannot be)."""
        self.packed_gate_up, self.gate_up_bias = pack_stacked(self.stacked_linears(), pack)
        return self.packed_gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        if self.packed_gate_up is not None and takes_packed(x, self.gate_proj.weight, _numel(self.stacked_linears())):
            rows = chunk_rows(2 * self.gate_proj.out_features, x.element_size())
            if x.shape[0] <= rows:
                return self._packed_forward(x)
            return torch.cat([self._packed_forward(part) for part in x.split(rows)])
        gate, up = linear_n(x, (self.gate_proj, self.up_proj))  # one skinny-kernel call for both on CPU
        kernels = kernels_for(gate) if self.fused_silu else None
        if kernels is not None:
            return self.down_proj(kernels.silu_and_mul_pair(gate, up))
        return self.down_proj(self.act(gate) * up)


def _numel(layers: Sequence[Linear]) -> int:
    return sum(layer.weight.numel() for layer in layers)
