"""GGUF weights kept in the file's own block layouts (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): a
GGUF model then streams the 4.5-8.5 bits per weight its file holds in every decode step instead of
float32's 32. Q4_1, Q5_0 and Q5_1 matter where rows are not a multiple of 256 (Qwen2.5-0.5B's 896):
llama-quantize falls back to them from the K-quants.

The layouts are llama.cpp's (ggml-quants.c; gguf-py's quants.py is the reference the tests hold us
to). A row of a weight [N, K] is K / block_size blocks, each a run of bytes with its scales inside.
`GGUFWeight.data` keeps those bytes as they are in the file, [N, row_bytes] uint8.

  * A few rows of x (a decode step): csrc/gguf_linear.cpp widens each block's weights to float32 in
    registers and reads each byte once per call.
  * More rows (big decode batches, a prefill): gguf_gemm decodes W a tile of rows at a time into a
    per-thread float32 buffer and multiplies every row of x by it (csrc/tiled_gemm.h). With
    bfloat16 x on a CPU with native bf16 GEMMs (AMX, AVX512-BF16), from 32 rows on (128 for an
    LM head), W is decoded to bfloat16 a slab at a time for oneDNN's GEMM instead (slab_gemm.py):
    there the native bf16 GEMM outruns the float32 tiled GEMM once the decode is spread over many
    rows; so does float32 x on float32 slabs for MKL where the kernels were built without AVX-512
    (docs/benchmarks.md has the crossovers behind these row limits).
  * No kernels (TRAM_CPU_KERNELS=0, another device, float16): `dequantize_gguf` below, in PyTorch,
    then F.linear in float32 (`reference_linear`).

With `int8_activations` (`--gguf-activations int8`) every call, whatever its rows, goes to
csrc/gguf_int8.cpp instead: x quantized to int8 (`quantize_activations`: per 256 values for the
K-quants, llama.cpp's Q8_K, per 32 for the others) meets the weights' integer quants in integer dot
products, as llama.cpp and vLLM's GGUF kernels compute. Its
PyTorch reference is `reference_linear_int8`: the same int8 activations, dequantized, times the
dequantized weight. Where the build prefers it, the loader repacks Q4_K, Q6_K, Q5_0 and Q8_0 rows eight
at a time (`repack_for_int8`, types Q4_K_X8, Q6_K_X8, Q5_0_X8 and Q8_0_X8; csrc/gguf_x8.h), for one kernel at every
row count that needs no horizontal sums and no per-call repacking.

The type ids and block sizes are written out here (they are part of the file format) so that this
module does not need the gguf package; the tests check them against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import torch
import torch.nn.functional as F

import tram.envs as envs
from tram.model.quant.slab_gemm import Decode, slab_linear, wants_slabs
from tram.model.quant.weights import SKINNY_MAX_ROWS, QuantizedWeight, _kernels, reference_linear

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 2, 3, 6, 7, 8, 12, 13, 14  # gguf.GGMLQuantizationType values
_NAMES = {
    Q8_0: "Q8_0",
    Q4_0: "Q4_0",
    Q4_1: "Q4_1",
    Q5_0: "Q5_0",
    Q5_1: "Q5_1",
    Q4_K: "Q4_K",
    Q5_K: "Q5_K",
    Q6_K: "Q6_K",
}
BLOCK_SIZES = {  # (k, bytes) per block
    Q8_0: (32, 34),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q5_0: (32, 22),
    Q5_1: (32, 24),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
}
GGUF_KEPT_TYPES = frozenset(BLOCK_SIZES)
# Not ggml types: Q4_K, Q6_K, Q5_0 and Q8_0 rows repacked eight at a time for the int8-activation kernels
# where the build prefers them (csrc/gguf_x8.h; `repack_for_int8`), in groups of 8 rows; (k, bytes) per row
# and block.
Q4_K_X8, Q6_K_X8, Q5_0_X8, Q8_0_X8 = 1012, 1014, 1006, 1008
REPACKED = {Q4_K_X8: Q4_K, Q6_K_X8: Q6_K, Q5_0_X8: Q5_0, Q8_0_X8: Q8_0}  # the repacked type's file type
_NAMES.update({Q4_K_X8: "Q4_K x8", Q6_K_X8: "Q6_K x8", Q5_0_X8: "Q5_0 x8", Q8_0_X8: "Q8_0 x8"})
BLOCK_SIZES_ALL = {**BLOCK_SIZES, Q4_K_X8: (256, 156), Q6_K_X8: (256, 210), Q5_0_X8: (32, 22), Q8_0_X8: (32, 34)}


def _type_name(ggml_type: int) -> str:
    if ggml_type in _NAMES:
        return _NAMES[ggml_type]
    try:
        from gguf import GGMLQuantizationType

        return f"{GGMLQuantizationType(ggml_type).name} ({ggml_type})"
    except (ImportError, ValueError):
        return f"type {ggml_type}"


def check_gguf_data(data: torch.Tensor, ggml_type: int, in_features: int) -> None:
    """ValueError unless data is [N, row_bytes] uint8 holding rows of in_features weights of ggml_type."""
    if ggml_type not in BLOCK_SIZES_ALL:
        kept = ", ".join(_NAMES[t] for t in sorted(GGUF_KEPT_TYPES))
        raise ValueError(f"GGUF {_type_name(ggml_type)} is not kept quantized: the kept types are {kept}")
    name = _NAMES[ggml_type]
    if data.dtype != torch.uint8 or data.dim() != 2:
        raise ValueError(
            f"GGUF {name} data must be a 2-D uint8 tensor [N, row_bytes], got {data.dtype} {tuple(data.shape)}"
        )
    if ggml_type in REPACKED and data.shape[0] % 8:
        raise ValueError(f"GGUF {name} data holds groups of 8 rows, not {data.shape[0]}")
    block, size = BLOCK_SIZES_ALL[ggml_type]
    if in_features <= 0 or in_features % block:
        raise ValueError(f"GGUF {name} rows hold a multiple of {block} weights, not in_features={in_features}")
    if data.shape[1] != in_features // block * size:
        raise ValueError(
            f"GGUF {name} rows of {in_features} weights are {in_features // block * size} bytes, got {data.shape[1]}"
        )


# ---- the pure-PyTorch dequantizers: blocks [B, bytes] uint8 -> [B, block] float32, each value bit
# for bit gguf.quants.dequantize's (the same products and differences, each rounded to float32) -----


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[B, 2] bytes -> [B, 1] float32 (fp16 widens exactly)."""
    return b.contiguous().view(torch.float16).float()


def _shifted(b: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """[B, G, L] bytes -> [B, G, len(shifts), L]: (b >> s) & mask for each shift s."""
    s = torch.tensor(shifts, dtype=torch.uint8, device=b.device).view(1, 1, -1, 1)
    return (b.unsqueeze(2) >> s) & mask


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks[:, :2])


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _shifted(blocks[:, None, 2:], [0, 4], 15).reshape(-1, 32)  # low nibbles k 0..15, high 16..31
    return _f16(blocks[:, :2]) * (q.float() - 8)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _shifted(blocks[:, None, 4:], [0, 4], 15).reshape(-1, 32)
    return _f16(blocks[:, :2]) * q.float() + _f16(blocks[:, 2:4])  # gguf: (d * q) + m, each rounded


def _q5(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1 quants [B, 32] 0..31: nibbles as Q4_0's, and bit j of the little-endian uint32 qh
    ([B, 4] bytes) is bit 4 of weight j."""
    low = _shifted(qs[:, None], [0, 4], 15).reshape(-1, 32)
    high = _shifted(qh.unsqueeze(2), list(range(8)), 1).reshape(-1, 32)  # [B, byte, bit] -> weight 8 * byte + bit
    return low | (high << 4)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks[:, :2]) * (_q5(blocks[:, 2:6], blocks[:, 6:]).float() - 16)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    return _f16(blocks[:, :2]) * _q5(blocks[:, 4:8], blocks[:, 8:]).float() + _f16(blocks[:, 2:4])


def _k4_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes of packed 6-bit values -> the 8 sub-blocks' (scale, min), [B, 8] float32 each."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scale = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=1)
    mins = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=1)
    return scale.float(), mins.float()


def _k4(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K: (d * scale) * q - dmin * min per sub-block of 32; q [B, 8, 32] float32."""
    scale, mins = _k4_scale_min(blocks[:, 4:16])
    ds = (_f16(blocks[:, 0:2]) * scale).unsqueeze(2)
    dm = (_f16(blocks[:, 2:4]) * mins).unsqueeze(2)
    return (ds * q - dm).reshape(-1, 256)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    q = _shifted(blocks[:, 16:].reshape(-1, 4, 32), [0, 4], 15).reshape(-1, 8, 32)
    return _k4(blocks, q.float())


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    low = _shifted(blocks[:, 48:].reshape(-1, 4, 32), [0, 4], 15).reshape(-1, 8, 32)
    high = _shifted(blocks[:, None, 16:48], list(range(8)), 1).reshape(-1, 8, 32)  # bit j: sub-block j
    return _k4(blocks, (low | (high << 4)).float())


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    low = _shifted(blocks[:, :128].reshape(-1, 2, 64), [0, 4], 15).reshape(-1, 8, 32)
    high = _shifted(blocks[:, 128:192].reshape(-1, 2, 32), [0, 2, 4, 6], 3).reshape(-1, 8, 32)
    q = ((low | (high << 4)).float() - 32).reshape(-1, 16, 16)
    ds = _f16(blocks[:, 208:210]) * blocks[:, 192:208].contiguous().view(torch.int8).float()  # [B, 16]
    return (ds.unsqueeze(2) * q).reshape(-1, 256)


_DEQUANTIZERS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    Q8_0: _q8_0,
    Q4_0: _q4_0,
    Q4_1: _q4_1,
    Q5_0: _q5_0,
    Q5_1: _q5_1,
    Q4_K: _q4_k,
    Q5_K: _q5_k,
    Q6_K: _q6_k,
}


def dequantize_gguf(data: torch.Tensor, ggml_type: int, in_features: int) -> torch.Tensor:
    """GGUF rows [N, row_bytes] uint8 -> the float32 weight [N, in_features], as gguf.quants.dequantize."""
    check_gguf_data(data, ggml_type, in_features)
    if ggml_type in REPACKED:
        data, ggml_type = unpack_repacked(data, ggml_type), REPACKED[ggml_type]
    size = BLOCK_SIZES[ggml_type][1]
    blocks = data.reshape(-1, size)  # [N * blocks per row, size]
    return _DEQUANTIZERS[ggml_type](blocks).reshape(data.shape[0], in_features)


K_QUANTS = frozenset({Q4_K, Q5_K, Q6_K, Q4_K_X8, Q6_K_X8})


def _cpu_kernels() -> ModuleType:
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        raise ValueError("repacked GGUF data (Q4_K x8, Q6_K x8, Q5_0 x8, Q8_0 x8) needs Tram's C++ CPU kernels")
    return kernels


def unpack_repacked(data: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """Repacked rows (Q4_K x8, Q6_K x8, Q5_0 x8, Q8_0 x8) -> the file's rows of REPACKED[ggml_type], bit for bit."""
    return _cpu_kernels().gguf_x8_unpack(data.contiguous(), ggml_type)


def repack_for_int8(data: torch.Tensor, ggml_type: int, experts: bool = False) -> tuple[torch.Tensor, int]:
    """(data, type) in the layout this machine's int8-activation kernels multiply fastest: Q4_K, Q6_K, Q5_0
    and Q8_0 rows [..., N, row_bytes] with N a multiple of 8 are repacked eight rows at a time where the
    build prefers it for their type (csrc/gguf_x8.cpp: all four on AVX2, all but Q6_K on AVX-512), else
    returned as they are. The fused MoE kernel (`experts`) takes the K-quants' layouts only.
    TRAM_GGUF_REPACK=0 keeps the file's layout."""
    kinds = (Q4_K, Q6_K) if experts else tuple(REPACKED.values())
    if ggml_type not in kinds or data.device.type != "cpu" or data.dim() < 2 or data.shape[-2] % 8:
        return data, ggml_type
    if not envs.TRAM_GGUF_REPACK:
        return data, ggml_type
    from tram.model.kernels.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None or not kernels.gguf_x8_preferred(ggml_type):
        return data, ggml_type
    packed = kernels.gguf_x8_pack(data.reshape(-1, data.shape[-1]).contiguous(), ggml_type)
    return packed.reshape(*data.shape[:-1], packed.shape[-1]), kernels.gguf_x8_type(ggml_type)


def activation_block(ggml_type: int) -> int:
    """k per activation scale under int8 activations: 256 for the K-quants (llama.cpp's Q8_K, so a whole
    super-block sums in integers), 32 for the others (Q8_0's)."""
    return 256 if ggml_type in K_QUANTS else 32


def quantize_activations(x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (int8 [M, K], float32 scales [M, K / block]) as csrc/gguf_int8.cpp quantizes it, bit for
    bit: per `block` values d = max|x| / 127 and q = round-half-even(x * (1 / d)), 0 where d is 0."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // block, block)
    d = blocks.abs().amax(dim=2, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-127, 127).to(torch.int8)
    return q.reshape(m, k), d.reshape(m, k // block)


def dequantize_activations(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x as the int8 activations stand for it: quantized per `block` values and multiplied back, x's shape."""
    q, d = quantize_activations(x.reshape(-1, x.shape[-1]), block)
    return (q.float().reshape(q.shape[0], -1, block) * d.unsqueeze(2)).reshape(x.shape)


def reference_linear_int8(x: torch.Tensor, weight: GGUFWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """The int8-activation product in PyTorch: x's int8 quants times their scales, then F.linear with the
    dequantized weight in float32, rounded once to x's dtype (the kernel differs in summation order only)."""
    xd = dequantize_activations(x, activation_block(weight.ggml_type))
    y = F.linear(xd, weight.dequantize(torch.float32), None if bias is None else bias.float())
    return y.to(x.dtype)


class GGUFWeight(QuantizedWeight):
    """A linear (or embedding) weight [N, K] kept as a GGUF file's blocks of one ggml type.
    int8_activations: apply() quantizes x to int8 per 32 values (llama.cpp's numerics)."""

    def __init__(self, data: torch.Tensor, ggml_type: int, in_features: int, int8_activations: bool = False) -> None:
        check_gguf_data(data, int(ggml_type), int(in_features))
        self.data = data.contiguous()
        self.ggml_type = int(ggml_type)
        self.out_features, self.in_features = data.shape[0], int(in_features)
        self.int8_activations = bool(int8_activations)
        # The base class's int8/int4 fields: the blocks are the quantized weight, and their scales
        # are inside them (nothing here reads these; they keep the interface's attributes honest).
        self.qweight = self.data
        self.scale = torch.empty(0)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kernels = _kernels(x) if self.data.device == x.device else None
        if self.int8_activations:
            if kernels is None:
                return reference_linear_int8(x, self, bias)
            return kernels.gguf_linear_int8(x, self.data, self.ggml_type, bias)
        if kernels is None:
            return reference_linear(x, self, bias)
        if x.shape[0] <= SKINNY_MAX_ROWS:
            return kernels.gguf_linear(x, self.data, self.ggml_type, bias)
        if wants_slabs(x, self.out_features, self.in_features, kernels):
            return slab_linear(x, self.out_features, self.in_features, self.decoded_rows(kernels), bias)
        return kernels.gguf_gemm(x, self.data, self.ggml_type, bias)

    def apply_n(
        self, x: torch.Tensor, others: Sequence[QuantizedWeight], biases: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor] | None:
        """q/k/v, gate/up: the weights' rows in one parallel region (with int8 activations, x quantized
        once); None where this takes the weights one by one (a mix of numerics, many rows, no kernels)."""
        weights = (self, *others)
        int8 = self.int8_activations
        if not all(
            isinstance(w, GGUFWeight) and w.int8_activations == int8 and w.data.device == x.device for w in weights
        ):
            return None
        kernels = _kernels(x)
        if kernels is None or x.dim() != 2 or (not int8 and x.shape[0] > SKINNY_MAX_ROWS):
            return None
        data = [w.data for w in weights]  # type: ignore[attr-defined]
        types = [w.ggml_type for w in weights]  # type: ignore[attr-defined]
        run = kernels.gguf_linear_int8_n if int8 else kernels.gguf_linear_n
        return run(x, data, types, list(biases))

    def decoded_rows(self, kernels: ModuleType) -> Decode:
        """Rows n0 .. n1 - 1 of the blocks decoded into a float32 or bfloat16 slab (gguf_dequantize_)."""

        def decode(n0: int, n1: int, out: torch.Tensor) -> None:
            kernels.gguf_dequantize_(out, self.data[n0:n1], self.ggml_type)

        return decode

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_gguf(self.data, self.ggml_type, self.in_features).to(dtype)

    def embedding(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows `ids` of the dequantized weight ([*ids.shape, K]), decoding only those rows: a quantized
        token embedding."""
        if self.ggml_type in REPACKED:  # the groups holding the ids, unpacked, then the ids' rows
            flat = ids.reshape(-1)
            groups = self.data.view(-1, 8 * self.data.shape[1]).index_select(0, flat // 8)
            unpacked = unpack_repacked(groups.view(-1, self.data.shape[1]), self.ggml_type).view(flat.numel(), 8, -1)
            rows = unpacked[torch.arange(flat.numel()), flat % 8]
            w = GGUFWeight(rows.contiguous(), REPACKED[self.ggml_type], self.in_features)
            return w.embedding(torch.arange(flat.numel()), dtype).reshape(*ids.shape, self.in_features)
        rows = self.data.index_select(0, ids.reshape(-1))
        out = torch.empty(rows.shape[0], self.in_features, dtype=dtype, device=rows.device)
        kernels = _kernels(out)
        if kernels is None:
            out = dequantize_gguf(rows, self.ggml_type, self.in_features).to(dtype)
        else:
            kernels.gguf_dequantize_(out, rows, self.ggml_type)
        return out.reshape(*ids.shape, self.in_features)

    @property
    def file_type(self) -> int:
        """The ggml type of the file's blocks (the same as ggml_type unless they were repacked)."""
        return REPACKED.get(self.ggml_type, self.ggml_type)

    @property
    def nbytes(self) -> int:
        return self.data.numel()
