"""Filling a model from a GGUF file: the common quantized types stay in their block layouts
(GGUFWeight, run by csrc/gguf_linear.cpp), everything else becomes the model's dtype at load.

Two steps around `materialize`: `plan_gguf_weights` runs on the meta-device model and gives every
layer whose tensor stays quantized an empty float weight (so no float copy is ever allocated), then
`load_gguf_weights` fills the model. Quantized tensors can land on a Linear (`quant`), on the token
embedding (rows dequantized as they are looked up) and on an untied LM head; a tied head multiplies
by the embedding's quantized weight. The block-layout kernels are CPU kernels: on a GPU the plan
keeps nothing, and every tensor is dequantized at load (the file runs in its float model's memory).

On the way the converter's changes are undone (names.py says where): q/k rows of the Llama-like
families go back to rotate-half order, Gemma's norms from w + 1 to w; a fused tensor (Phi-3's
attn_qkv, ffn_up) is cut into the model's separate linears (its `fused_weights`), each part's rows
kept in their blocks or dequantized as a tensor of its own. A mixture of experts' stacked tensors
(`ffn_*_exps`) go to its FusedMoE layers (experts.py); its router (`ffn_gate_inp`) stays float.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from tram.model.gguf.experts import ExpertLoader, plan_experts
from tram.model.gguf.file import close_gguf, gguf_architecture, open_gguf
from tram.model.gguf.names import (
    IGNORED_TENSORS,
    PERMUTED_ARCHITECTURES,
    ExpertTensor,
    expert_tensor,
    hf_name,
    norm_plus_one,
    unpermute_rows,
)
from tram.model.gguf.weight import GGUF_KEPT_TYPES, GGUFWeight, repack_for_int8
from tram.model.layers.moe.router import Router
from tram.model.quant.slab_gemm import bf16_gemm_fast
from tram.model.weight_utils import fused_parts, load_named_weight, name_list

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


@dataclass(frozen=True)
class _Target:
    """A parameter that a file's tensor fills: all of its rows, or (a fused tensor: Phi-3's attn_qkv
    and ffn_up, which Tram keeps as separate linears) a run of them."""

    name: str
    module: nn.Module
    rows: slice | None = None

    @property
    def leaf(self) -> str:
        return self.name.rpartition(".")[2]


def _targets(model: nn.Module, name: str) -> list[_Target]:
    """What the tensor of Hugging Face name `name` fills ([]: nothing in this model)."""
    module = _owner(model, name)
    if module is not None:
        return [_Target(name, module)]
    targets, start = [], 0
    for part, rows in fused_parts(model, name):  # in the order the tensor stacks them
        owner = _owner(model, part)
        if owner is None:
            return []
        targets.append(_Target(part, owner, slice(start, start + rows)))
        start += rows
    return targets


def _keeps_quantized(module: nn.Module, leaf: str, qtype: int) -> bool:
    # A router is small and picks the experts: it stays float, as llama.cpp's quantizer leaves it.
    return leaf == "weight" and qtype in GGUF_KEPT_TYPES and hasattr(module, "quant") and not isinstance(module, Router)


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
    arch = gguf_architecture(reader, path)
    plan_experts(model, reader.tensors)
    for t in reader.tensors:
        name = hf_name(t.name, arch)
        if name is None or not name.endswith(".weight"):
            continue
        for target in _targets(model, name):
            if _keeps_quantized(target.module, "weight", int(t.tensor_type)):
                dtype = target.module.weight.dtype
                target.module.weight = nn.Parameter(torch.empty(0, dtype=dtype, device="meta"), requires_grad=False)


@torch.no_grad()
def load_gguf_weights(model: nn.Module, path: str, hf_config: Any, int8_activations: bool = False) -> None:
    """Fill every parameter from the file; ValueError names missing, unexpected or misshapen tensors.
    int8_activations: the kept tensors' linears quantize their input (`GGUFWeight`)."""
    start = time.perf_counter()
    reader = open_gguf(path)
    arch = gguf_architecture(reader, path)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    converted: dict[str, int] = {}
    kept = 0
    experts = ExpertLoader(model, path, hf_config.hidden_size, _dequantized, int8_activations)
    for t in reader.tensors:
        where = expert_tensor(t.name)
        if where is not None:
            kept += _load_experts(model, experts, t, where, converted, unexpected)
            continue
        name = hf_name(t.name, arch)
        targets = [] if name is None else _targets(model, name)
        if not targets:
            # not a weight (RoPE factors), a tensor of another pipeline stage, or one this model lacks
            if t.name not in IGNORED_TENSORS and (name is None or name not in _stage_skipped(model, name)):
                unexpected.append(t.name)
            continue
        _check_fused_rows(t, targets, path)
        for target in targets:
            kept += _load_target(target, t, arch, hf_config, path, int8_activations, converted)
            loaded.add(target.name)
    _check_complete(model, params, loaded | experts.loaded_names(), unexpected, path)
    close_gguf()  # the map's pages count in the resident set while a reader holds it
    _log_summary(path, next(iter(params.values())), kept, converted, int8_activations, start)


def _check_fused_rows(t: Any, targets: list[_Target], path: str) -> None:
    if targets[-1].rows is not None and targets[-1].rows.stop != t.data.shape[0]:
        parts = ", ".join(target.name for target in targets)
        raise ValueError(f"Tensor {t.name} in {path} has {t.data.shape[0]} rows; {parts} take {targets[-1].rows.stop}")


def _load_experts(
    model: nn.Module,
    experts: ExpertLoader,
    t: Any,
    where: ExpertTensor,
    converted: dict[str, int],
    unexpected: list[str],
) -> int:
    """A stacked expert tensor into its FusedMoE; 1 where it stays in its blocks, else 0."""
    kept = experts.load(t, where)
    if kept is None:
        name = f"{where.module}.{where.param}_{where.kind}"
        if name not in _stage_skipped(model, name):
            unexpected.append(t.name)
        return 0
    if not kept:
        _count_converted(int(t.tensor_type), converted)
    return int(kept)


def _load_target(
    target: _Target,
    t: Any,
    arch: str,
    hf_config: Any,
    path: str,
    int8_activations: bool,
    converted: dict[str, int],
) -> int:
    """Fill one parameter from its rows of `t`; 1 where they stay quantized (a GGUFWeight), else 0."""
    qtype = int(t.tensor_type)
    data = _rows(t, target, hf_config, arch in PERMUTED_ARCHITECTURES)
    if _keeps_quantized(target.module, target.leaf, qtype) and target.module.weight.numel() == 0:
        target.module.quant = _quantized(t, data, qtype, target.name, path, int8_activations)
        return 1
    _load_float(getattr(target.module, target.leaf), target.name, t, data, arch, path, converted)
    return 0


def _load_float(
    param: nn.Parameter, name: str, t: Any, data: np.ndarray, arch: str, path: str, converted: dict[str, int]
) -> None:
    """A tensor that becomes the model's dtype; `converted` counts the quantized types among them."""
    qtype = int(t.tensor_type)
    _count_converted(qtype, converted)
    tensor = _dequantized(data, qtype)
    if norm_plus_one(arch, t.name):
        tensor = tensor.float() - 1  # back to Gemma's (1 + w) form, as the model computes it
    load_named_weight(name, param, tensor, path)


def _count_converted(qtype: int, converted: dict[str, int]) -> None:
    """Count a quantized type that became the model's dtype (float files' types are no conversion)."""
    from gguf import GGMLQuantizationType

    type_name = GGMLQuantizationType(qtype).name
    if type_name not in _FLOAT_TYPES:
        converted[type_name] = converted.get(type_name, 0) + 1


def _log_summary(
    path: str, first: torch.Tensor, kept: int, converted: dict[str, int], int8_activations: bool, start: float
) -> None:
    """`first`: any float parameter (they all have the model's dtype and device)."""
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


def _rows(t: Any, target: _Target, hf_config: Any, permuted: bool) -> np.ndarray:
    """The target's rows of the tensor as [rows, ...] (numpy; quantized types as raw bytes per row),
    with permuted q/k rows (Llama-like families) put back in Hugging Face's order."""
    data = t.data if target.rows is None else t.data[target.rows]
    name = target.name
    if permuted and (".q_proj." in name or ".k_proj." in name):
        heads = hf_config.num_attention_heads if ".q_proj." in name else hf_config.num_key_value_heads
        data = unpermute_rows(data, heads)
    return data


def _quantized(t: Any, data: np.ndarray, qtype: int, name: str, path: str, int8_activations: bool) -> GGUFWeight:
    in_features = int(t.shape[0])  # ggml order: ne0 is the row length
    try:  # a private copy, not the map
        tensor = torch.from_numpy(np.array(data))
        if int8_activations:
            tensor, qtype = repack_for_int8(tensor, qtype)
        return GGUFWeight(tensor, qtype, in_features, int8_activations)
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
