"""Filling a model from a GGUF file: the common quantized types stay in their block layouts
(GGUFWeight, run by csrc/gguf_linear.cpp), everything else becomes the model's dtype at load.

Two steps around `materialize`: `plan_gguf_weights` runs on the meta-device model and gives every
layer whose tensor stays quantized an empty float weight (so no float copy is ever allocated), then
`load_gguf_weights` fills the model. Quantized tensors can land on a Linear (`quant`), on the token
embedding (rows dequantized as they are looked up) and on an untied LM head; a tied head multiplies
by the embedding's quantized weight. The block-layout kernels are CPU kernels: on a GPU the plan
keeps nothing, and every tensor is dequantized at load (the file runs in its float model's memory).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from tram.model.gguf.file import IGNORED_TENSORS, close_gguf, gguf_architecture, hf_name, open_gguf, unpermute_rows
from tram.model.gguf.weight import GGUF_KEPT_TYPES, GGUFWeight
from tram.model.quant.slab_gemm import bf16_gemm_fast
from tram.model.weight_utils import load_named_weight, name_list

logger = logging.getLogger(__name__)

_FLOAT_TYPES = ("F32", "F16", "BF16")


def check_gguf_placement(device_type: str) -> None:
    """GGUF files run on one rank for now: a quantized row cannot be split across tensor-parallel
    ranks by the float loaders. On CUDA they run dequantized (plan_gguf_weights keeps nothing)."""
    from tram.distributed import get_tp

    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"GGUF files run on CPU and CUDA devices, not {device_type!r}")
    if get_tp().size > 1:
        raise ValueError("GGUF files run without tensor parallelism for now (tensor_parallel_size 1)")


def _owner(model: nn.Module, name: str) -> nn.Module | None:
    """The module holding parameter `name` (None: not in this model, e.g. another pipeline stage's)."""
    path, _, leaf = name.rpartition(".")
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    return module if leaf in dict(module.named_parameters(recurse=False)) else None


def _keeps_quantized(module: nn.Module, leaf: str, qtype: int) -> bool:
    return leaf == "weight" and qtype in GGUF_KEPT_TYPES and hasattr(module, "quant")


def plan_gguf_weights(model: nn.Module, path: str, keep_quantized: bool = True) -> None:
    """On the meta-device model: layers whose tensors stay quantized give up their float weight
    (none where `keep_quantized` is False: load_gguf_weights then dequantizes every tensor)."""
    if not keep_quantized:
        logger.warning(
            "GGUF off the CPU: Tram has no GPU kernels for GGUF's block types yet, so every tensor "
            "is dequantized to the model's dtype at load (the float model's memory); the Hugging "
            "Face checkpoint, or a GPTQ/AWQ/compressed-tensors one, runs as fast in less memory"
        )
        return
    reader = open_gguf(path)
    for t in reader.tensors:
        name = hf_name(t.name)
        module = None if name is None else _owner(model, name)
        if module is not None and _keeps_quantized(module, "weight", int(t.tensor_type)) and name.endswith(".weight"):
            dtype = module.weight.dtype
            module.weight = nn.Parameter(torch.empty(0, dtype=dtype, device="meta"), requires_grad=False)


@torch.no_grad()
def load_gguf_weights(model: nn.Module, path: str, hf_config: Any, int8_activations: bool = False) -> None:
    """Fill every parameter from the file; ValueError names missing, unexpected or misshapen tensors.
    int8_activations: the kept tensors' linears quantize their input (`GGUFWeight`)."""
    from gguf import GGMLQuantizationType

    start = time.perf_counter()
    reader = open_gguf(path)
    llama = gguf_architecture(reader, path) == "llama"
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    converted: dict[str, int] = {}
    kept = 0
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name not in IGNORED_TENSORS:
                unexpected.append(t.name)
            continue
        module = _owner(model, name)
        if module is None:  # a tensor of another pipeline stage, or a name this model lacks
            if name not in _stage_skipped(model, name):
                unexpected.append(t.name)
            continue
        qtype = int(t.tensor_type)
        data = _rows(t, name, hf_config, llama)
        leaf = name.rpartition(".")[2]
        if _keeps_quantized(module, leaf, qtype) and module.weight.numel() == 0:
            module.quant = _quantized(t, data, qtype, name, path, int8_activations)
            kept += 1
        else:
            type_name = GGMLQuantizationType(qtype).name
            if type_name not in _FLOAT_TYPES:
                converted[type_name] = converted.get(type_name, 0) + 1
            load_named_weight(name, params[name], _dequantized(data, qtype), path)
        loaded.add(name)
    _check_complete(model, params, loaded, unexpected, path)
    close_gguf()  # the map's pages count in the resident set while a reader holds it
    first = next(iter(params.values()))  # every float parameter has the model's dtype and device
    if converted:
        logger.info(
            "GGUF types %s have no kernel in Tram: dequantized at load to %s",
            ", ".join(f"{k} ({n} tensors)" for k, n in sorted(converted.items())),
            first.dtype,
        )
    logger.info("Read %s: %d tensors kept quantized in %.2f s", path, kept, time.perf_counter() - start)
    if (
        kept
        and first.dtype == torch.float32
        and first.device.type == "cpu"
        and not int8_activations
        and bf16_gemm_fast()
    ):
        logger.info(
            "GGUF linears take float32 activations (transformers' numbers); this CPU has native "
            "bf16 GEMMs, with which --dtype bfloat16 prefills several times faster"
        )


def _stage_skipped(model: nn.Module, name: str) -> set[str]:
    """{name} when the name belongs to a layer cut away by pipeline parallelism, else empty."""
    skip = tuple(getattr(model, "missing_prefixes", ()))
    return {name} if skip and name.startswith(skip) else set()


def _rows(t: Any, name: str, hf_config: Any, llama: bool) -> np.ndarray:
    """The tensor's data as [rows, ...] (numpy; quantized types as raw bytes per row), with
    llama q/k rows put back in Hugging Face's order."""
    data = t.data
    if llama and (".q_proj." in name or ".k_proj." in name):
        heads = hf_config.num_attention_heads if ".q_proj." in name else hf_config.num_key_value_heads
        data = unpermute_rows(data, heads)
    return data


def _quantized(t: Any, data: np.ndarray, qtype: int, name: str, path: str, int8_activations: bool) -> GGUFWeight:
    in_features = int(t.shape[0])  # ggml order: ne0 is the row length
    try:  # a private copy, not the map
        return GGUFWeight(torch.from_numpy(np.array(data)), qtype, in_features, int8_activations)
    except ValueError as err:
        raise ValueError(f"Tensor {t.name} ({name}) in {path}: {err}") from err


def _dequantized(data: np.ndarray, qtype: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(np.array(data))
    try:
        return torch.from_numpy(np.array(dequantize(data, GGMLQuantizationType(qtype))))
    except NotImplementedError as err:
        raise ValueError(
            f"GGUF type {GGMLQuantizationType(qtype).name} cannot be dequantized by the gguf package ({err})"
        ) from err


def _check_complete(
    model: nn.Module, params: dict[str, nn.Parameter], loaded: set[str], unexpected: list[str], path: str
) -> None:
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        raise ValueError(
            f"GGUF file {path} does not match the model: missing weights {name_list(missing)}; "
            f"unexpected tensors {name_list(sorted(unexpected))}"
        )
