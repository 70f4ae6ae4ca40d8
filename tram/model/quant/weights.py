"""Weight-only quantized linear weights made from float ones on the fly (`quantization="int8"` or
`"int4"`): what users with only the original checkpoint run to halve or quarter the bytes a decode
step streams, which on a CPU is what a step's time mostly is.

  * Int8Weight: symmetric per output channel, w ~ q * scale[n] with q in [-127, 127].
  * Int4Weight: symmetric per group of `group_size` input channels, w ~ (q - 8) * scale[n, g] with q
    in [0, 15] (-8..7 around zero), two to a byte in the layout csrc/quant_linear.cpp reads.

A few rows (a decode step) go through csrc/quant_linear.cpp, which widens the weights in registers
and reads each byte once per call. Past SKINNY_MAX_ROWS (big decode batches, prefill) quant_gemm
decodes W a tile of rows at a time into a per-thread float32 buffer in L2 and multiplies every row of
x by it (csrc/tiled_gemm.h): no weight-sized float temporary, and each output is one FMA chain over
k, so a row's result does not depend on the other rows (it differs from the skinny kernel's in the
last bits: a different order of additions). bfloat16 x of enough rows on a CPU with native bf16
GEMMs goes to oneDNN on bf16 slabs of W instead, float32 x to MKL on float32 slabs where the kernels
were built without AVX-512 (slab_gemm.py).
`dequantize()` gives the float weight both compute with; `reference_linear` multiplies by it with
F.linear, the pure-PyTorch path that TRAM_CPU_KERNELS=0 selects and the tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F

from tram.model.kernels.cpu_kernels import kernels_for
from tram.model.quant.slab_gemm import Decode, slab_linear, wants_slabs

INT4_GROUP_SIZES = (128, 64, 32)  # the largest that divides K is used; the kernel reads 32 k at a time
SKINNY_MAX_ROWS = 16  # past this the tiled GEMM (quant_gemm, gguf_gemm) wins on the 0.5B shapes


def _kernels(x: torch.Tensor):  # noqa: ANN202 - the extension module, or None
    """The CPU kernels where csrc/quant_linear.cpp takes x (2-D, float32 or bfloat16); None also
    where they are switched off (TRAM_CPU_KERNELS=0) or failed to build."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    return kernels_for(x)


class QuantizedWeight:
    """A linear layer's weight [N, K] in fewer bits; `apply(x, bias)` is x @ W.T + bias."""

    out_features: int
    in_features: int
    qweight: torch.Tensor
    scale: torch.Tensor
    group = 0  # int8: one scale per row
    zero: torch.Tensor | None = None  # [N, K / group] uint8 zero points (checkpoints); None: symmetric
    # The Triton GEMM on any device: set on CPU by tests, which run it under Triton's interpreter.
    use_triton = False

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.is_cuda or self.use_triton:
            return self.triton_apply(x, bias)
        kernels = _kernels(x)
        if kernels is None:
            return reference_linear(x, self, bias)
        if x.shape[0] <= SKINNY_MAX_ROWS:
            return kernels.quant_linear(x, self.qweight, self.scale, self.group, bias, self.zero)
        if wants_slabs(x, self.out_features, self.in_features, kernels):
            return slab_linear(x, self.out_features, self.in_features, self.decoded_rows(kernels), bias)
        return kernels.quant_gemm(x, self.qweight, self.scale, self.group, bias, self.zero)

    def apply_n(
        self, x: torch.Tensor, others: Sequence[QuantizedWeight], biases: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor] | None:
        """[w.apply(x, b) for w, b in zip((self, *others), biases)] in one kernel call where this format
        has one (x read and converted once); None where it has not, and the caller applies each."""
        return None

    def triton_apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The Triton W8A16 / W4A16 GEMM; imported here: triton is the gpu extra's."""
        from tram.model.quant.triton_linear import triton_quant_linear

        return triton_quant_linear(x, self.qweight, self.scale, self.group, bias, zero=self.zero)

    def to_(self, device: torch.device) -> QuantizedWeight:
        """Every tensor of the weight moved to `device` (checkpoints are repacked on the CPU)."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self

    def decoded_rows(self, kernels: ModuleType) -> Decode:
        """Rows n0 .. n1 - 1 of the weight decoded into a float32 or bfloat16 slab (quant_dequantize_)."""
        zero = self.zero

        def decode(n0: int, n1: int, out: torch.Tensor) -> None:
            kernels.quant_dequantize_(
                out, self.qweight[n0:n1], self.scale[n0:n1], self.group, None if zero is None else zero[n0:n1]
            )

        return decode

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()


def reference_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """Dequantize, then F.linear in float32, rounded once to x's dtype."""
    y = F.linear(x.float(), weight.dequantize(torch.float32), None if bias is None else bias.float())
    return y.to(x.dtype)


class Int8Weight(QuantizedWeight):
    def __init__(self, weight: torch.Tensor) -> None:
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.scale = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny).contiguous()  # [N]
        self.qweight = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scale[:, None]).to(dtype)


def int4_group_size(in_features: int) -> int | None:
    """The group size a weight with K = in_features gets in int4 (None: no supported size divides K)."""
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [N, K / 2] bytes: in each run of 32 k, byte j holds k = j (low nibble)
    and k = j + 16 (high nibble)."""
    runs = q.to(torch.uint8).view(q.shape[0], -1, 2, 16)  # [N, K / 32, 2, 16]
    return (runs[:, :, 0] | (runs[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """pack_int4's inverse: [N, K / 2] bytes -> [N, K] values 0..15 (uint8)."""
    runs = packed.view(packed.shape[0], -1, 16)  # [N, K / 32, 16]
    return torch.stack([runs & 15, runs >> 4], dim=2).reshape(packed.shape[0], -1)


class Int4Weight(QuantizedWeight):
    def __init__(self, weight: torch.Tensor, group_size: int) -> None:
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.group = group_size
        groups = w.view(self.out_features, -1, group_size)  # [N, K / g, g]
        scale = (groups.abs().amax(dim=2) / 7.0).clamp(min=torch.finfo(torch.float32).tiny)  # [N, K / g]
        q = torch.round(groups / scale[..., None]).clamp(-8, 7) + 8  # [N, K / g, g] in 0..15
        self.qweight = pack_int4(q.view(self.out_features, self.in_features))  # [N, K / 2]
        self.scale = scale.contiguous()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        q = unpack_int4(self.qweight).float().view(self.out_features, -1, self.group) - 8  # [N, K / g, g]
        return (q * self.scale[..., None]).view(self.out_features, self.in_features).to(dtype)
