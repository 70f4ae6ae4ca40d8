"""The C++ CPU kernels in families: each an extension module of its own, built when first needed.

A dense model in float32 or bfloat16 calls only the core family; the GGUF, int8/int4 and
mixture-of-experts kernels are most of the build's compile time and serve only models in those
formats. So set-up builds the core (scripts/setup.sh), and a family builds the first time one of
its functions is called (`CpuKernels` in cpu_kernels.py), or ahead with `tram build-kernels`, the
way JIT-compiled kernel libraries (FlashInfer, DeepGEMM) build on first use and cache the result.

Each family's bindings file (csrc/bindings_<family>.cpp) defines exactly the `functions` listed
here; tests/model/test_kernel_build.py checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelFamily:
    sources: tuple[str, ...]  # csrc/ files, longest compile first (ninja starts them in this order)
    functions: tuple[str, ...]  # what the module exports


FAMILIES: dict[str, KernelFamily] = {
    "core": KernelFamily(
        ("paged_decode.cpp", "small_kernels.cpp", "bindings_core.cpp"),
        (
            "paged_decode_attention",
            "paged_prefill_attention_",
            "skinny_linear",
            "skinny_linear_n",
            "pair_linear_built",
            "pair_linear_preferred",
            "pair_pack",
            "pair_linear",
            "moe_route",
            "write_kv_cache_",
            "rms_norm",
            "add_rms_norm",
            "rms_norm_add",
            "silu_and_mul",
            "silu_and_mul_pair",
            "argmax_rows",
            "widen_to_float",
            "rotary_",
            "vector_bits",
        ),
    ),
    "gguf": KernelFamily(
        ("gguf_linear.cpp", "gguf_int8.cpp", "gguf_x8.cpp", "bindings_gguf.cpp"),
        (
            "gguf_linear",
            "gguf_linear_n",
            "gguf_gemm",
            "gguf_dequantize_",
            "gguf_linear_int8",
            "gguf_linear_int8_n",
            "gguf_x8_pack",
            "gguf_x8_unpack",
            "gguf_x8_type",
            "gguf_x8_preferred",
            "quantize_activations_int8",
            "cpu_amx",
        ),
    ),
    "quant": KernelFamily(
        ("quant_linear.cpp", "bindings_quant.cpp"),
        ("quant_linear", "quant_dequantize_", "quant_gemm"),
    ),
    "moe": KernelFamily(
        ("fused_moe.cpp", "bindings_moe.cpp"),
        ("fused_moe", "fused_moe_tiles", "cpu_amx"),
    ),
}
SETUP_FAMILIES = ("core",)


def family_of(function: str) -> str | None:
    """The family that exports `function` (the first, for one several export); None if none does."""
    return next((name for name, family in FAMILIES.items() if function in family.functions), None)
