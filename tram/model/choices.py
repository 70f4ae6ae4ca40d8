"""The model layer's choices, registered with configuration, and its up-front checks of them.

Importing this module registers the attention backends (model/attention), the quantization methods
(model/quant's names; model/quant's check refuses the rest) and what a GGUF file's linears multiply
with. Torch-free: the API process validates and lists them before any engine process starts. The
checks that need the resolved model (its config, its files) are functions the engine calls when it
resolves EngineArgs: `checkpoint_quantization`, `check_model_files`.
"""

from __future__ import annotations

from typing import Any

import tram.model.attention  # noqa: F401 - registers the attention backends
from tram.config.model import checkpoint_quant_method, device_type
from tram.config.registry import GGUF_ACTIVATIONS, QUANTIZATION_METHODS
from tram.model.gguf.file import is_gguf
from tram.model.quant.check import check_quantization
from tram.model.quant.names import CHECKPOINT_METHODS, ON_THE_FLY

GGUF_QUANTIZATION = "gguf"  # vLLM's quantization name for what a GGUF file already is
GGUF_WITHOUT_TP = "GGUF files run without tensor parallelism for now (tensor_parallel_size 1)"
_ON_THE_FLY_HELP = {"int8": "per output channel", "int4": "groups of 128 input channels"}

for _method in ON_THE_FLY:
    _detail = _ON_THE_FLY_HELP.get(_method)
    QUANTIZATION_METHODS.add(_method, "made at load" + (f": {_detail}" if _detail else ""))
for _method in CHECKPOINT_METHODS:
    QUANTIZATION_METHODS.add(_method, "a quantized checkpoint's")
QUANTIZATION_METHODS.add(GGUF_QUANTIZATION, "a GGUF file's own blocks")

_GGUF_EXACT = "float32"
GGUF_ACTIVATIONS.add(
    _GGUF_EXACT,
    "the activations as they are, each weight widened to its dequantized value: the transformers oracle's numerics",
)
GGUF_ACTIVATIONS.add(
    "int8",
    "activations quantized per 32 values and integer dot products: llama.cpp's "
    "and vLLM's GGUF numerics, 1.2-2x faster kernels at 1-16 rows on Q5_0 and the "
    "K-quants, slower past ~64 rows; outputs differ slightly",
)


@QUANTIZATION_METHODS.add_check
def check_quantization_setting(name: str, args: Any) -> None:
    """A GGUF file takes no quantization but its own; anything else must run on the device."""
    if is_gguf(args.model):
        if name != GGUF_QUANTIZATION:
            raise ValueError(
                f"quantization {name!r} does not apply to a GGUF file, whose weights are already "
                f"quantized (leave it unset, or pass {GGUF_QUANTIZATION})"
            )
        return
    check_quantization(name, "cuda" if device_type(args.device) == "cuda" else "cpu")


@GGUF_ACTIVATIONS.add_check
def check_gguf_activations(name: str, args: Any) -> None:
    if name != _GGUF_EXACT and name in GGUF_ACTIVATIONS and not is_gguf(args.model):
        raise ValueError(f"gguf_activations {name!r} applies to GGUF files; {args.model!r} is not one")


def checkpoint_quantization(hf_config: Any, requested: str | None) -> str | None:
    """The quantization to run: the checkpoint's quant_method where its config has one (a requested
    method must then agree), else the requested one. ValueError on a disagreement."""
    method = checkpoint_quant_method(hf_config)
    if method is None:
        if requested in CHECKPOINT_METHODS:
            raise ValueError(
                f"quantization {requested!r} reads a {requested} checkpoint, but this model's "
                f"config.json has no quantization_config (for a float checkpoint choose "
                f"{' or '.join(ON_THE_FLY)})"
            )
        return requested
    if requested is None or requested == method:
        return method
    if requested in ON_THE_FLY:
        raise ValueError(
            f"quantization {requested!r} quantizes a float checkpoint at load, but this checkpoint is "
            f"already quantized ({method}); drop the quantization setting to serve it as it is"
        )
    raise ValueError(
        f"quantization {requested!r} does not match the checkpoint's quantization_config (quant_method {method!r})"
    )


def check_model_files(path: str, tensor_parallel_size: int) -> None:
    """Refusals that depend on what the model's files are (before anything reads them)."""
    if is_gguf(path) and tensor_parallel_size > 1:
        raise ValueError(GGUF_WITHOUT_TP)


def check_sliding_window(hf_config: Any, model_path: str) -> None:
    """A sliding window the attention kernels and the KV cache can use: a positive token count. One
    wider than the context is kept, as full attention (Phi-3-128k's 262144 over 131072 positions)."""
    window = getattr(hf_config, "sliding_window", None)
    if window is None or getattr(hf_config, "use_sliding_window", True) is False:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"{model_path}: sliding_window must be a positive number of tokens, got {window!r}")
