"""From a model name to a ready nn.Module: config, files (local or hub), class, weights.

The model is built on the meta device (no memory, no init cost), materialised empty on the target
device, then filled: from safetensors by name, each tensor through its parameter's `weight_loader`
(weight_utils.py), or with seeded random values ("dummy").
"""

from __future__ import annotations

import glob
import logging
import os
import time
from typing import Any

import torch
from torch import nn

from tram.config import ModelConfig
from tram.distributed import get_pp
from tram.model.attention import get_attention_backend
from tram.model.gguf.file import is_gguf
from tram.model.gguf.loader import check_gguf_placement, load_gguf_weights, plan_gguf_weights
from tram.model.hub import INDEX_FILE, read_index, resolve_model_path
from tram.model.hub import read_hf_config as get_hf_config  # noqa: F401 - the tests' entry point
from tram.model.layers.cpu_packed import pack_cpu_linears
from tram.model.layers.rope import fit_rope_to_context
from tram.model.pipeline import cut_to_stage
from tram.model.quant.apply import quantize_linears
from tram.model.quant.check import check_quantization
from tram.model.quant.checkpoints import CHECKPOINT_METHODS, CheckpointLoader, checkpoint_loader
from tram.model.registry import get_model_class
from tram.model.weight_utils import (
    WeightShapeError,
    checkpoint_owner,
    checkpoint_rename,
    fused_parts,
    get_weight_loader,
    load_named_weight,
    load_owned_weight,
    materialize,
    name_list,
    split_fused,
)

logger = logging.getLogger(__name__)

_SINGLE_FILE = "model.safetensors"
# Buffers that old checkpoints saved but that we recompute.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_DUMMY_STD = 0.02
_DUMMY_POOL = 1_000_003  # prime, so that rows of power-of-two widths do not repeat


def safetensors_files(path: str) -> list[str]:
    """The checkpoint's weight files: those of the shard index, or model.safetensors, or any *.safetensors."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        return [os.path.join(path, name) for name in sorted(set(read_index(index).values()))]
    if os.path.exists(os.path.join(path, _SINGLE_FILE)):
        return [os.path.join(path, _SINGLE_FILE)]
    # Mistral-format consolidated files use other weight names; they are not this checkpoint.
    files = sorted(
        f for f in glob.glob(os.path.join(path, "*.safetensors")) if not os.path.basename(f).startswith("consolidated")
    )
    if not files:
        raise ValueError(f"No safetensors weights found in {path}; only safetensors checkpoints are supported")
    return files


def load_model(model_config: ModelConfig, cls: type[nn.Module] | None = None) -> nn.Module:
    """Build the architecture's model (or `cls`: a speculative head, whose class its method names)
    on model_config.device in model_config.dtype and fill its weights."""
    start = time.perf_counter()
    model_config.resolve()
    cls = cls or get_model_class(model_config.architecture)
    backend = get_attention_backend(model_config.attention_backend)
    with torch.device("meta"):
        model = cls(model_config.hf_config, model_config.torch_dtype, backend)
    fit_rope_to_context(model, model_config.max_model_len)
    pp = get_pp()
    if pp.size > 1:
        cut_to_stage(model, pp.rank, pp.size)
    gguf = model_config.load_format != "dummy" and is_gguf(model_config.model)
    files: list[str] = []
    quant: CheckpointLoader | None = None
    if gguf:
        check_gguf_placement(model_config.torch_device.type)
        plan_gguf_weights(model, model_config.model, keep_quantized=model_config.torch_device.type == "cpu")
    elif model_config.load_format != "dummy":
        files = safetensors_files(resolve_model_path(model_config.model, model_config.revision))
        quant = checkpoint_loader(model_config.quantization, model_config.hf_config, model_config.torch_device, model)
        if quant is not None:
            quant.plan(files)
    materialize(model, model_config.torch_device)
    if model_config.load_format == "dummy":
        init_dummy_weights(model, model_config.seed)
    elif gguf:
        load_gguf_weights(
            model, model_config.model, model_config.hf_config, int8_activations=model_config.gguf_activations == "int8"
        )
    else:
        load_safetensors_weights(
            model,
            files,
            tied=_is_tied(model_config.hf_config),
            skip=getattr(model, "missing_prefixes", ()),
            quant=quant,
        )
    model.eval()
    model.requires_grad_(False)
    # A quantized checkpoint's layers were set while loading; on-the-fly methods quantize now.
    if model_config.quantization not in (None, *CHECKPOINT_METHODS):
        check_quantization(model_config.quantization, model_config.torch_device.type)
        quantize_linears(model, model_config.quantization)
    if model_config.torch_device.type == "cpu":
        pack_cpu_linears(model)
    num_params = sum(p.numel() for p in model.parameters()) + sum(
        m.quant.out_features * m.quant.in_features for m in model.modules() if getattr(m, "quant", None) is not None
    )
    logger.info(
        "Loaded %s (%s, %.1fM parameters, %s, %s) in %.2f s",
        model_config.model,
        cls.__name__,
        num_params / 1e6,
        model_config.dtype,
        model_config.load_format,
        time.perf_counter() - start,
    )
    return model


def _is_tied(hf_config: Any) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


@torch.no_grad()
def load_safetensors_weights(
    model: nn.Module, files: list[str], tied: bool, skip: tuple[str, ...] = (), quant: CheckpointLoader | None = None
) -> None:
    """Hand each checkpoint tensor to the weight loader of the parameter of the same name; with
    `quant` (a quantized checkpoint, `plan`ned on the files), the quantized Linears' tensors go to it
    instead.

    Streams tensor by tensor so peak host memory is one tensor, not the checkpoint.
    ValueError names every missing or unexpected weight (a wrong architecture or a broken file),
    or the weight a loader could not take.
    """
    from safetensors import safe_open

    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    owners: dict[str, nn.Module] = {}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for stored in f.keys():
                name = checkpoint_rename(model, stored)
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight") or name.startswith(skip):
                    continue
                if quant is not None and quant.claims(name):
                    quant.add(name, f.get_tensor(stored))
                    continue
                param = params.get(name)
                if param is None:
                    parts = fused_parts(model, name)
                    owner = None if parts else checkpoint_owner(modules, name)
                    if parts:  # one tensor for several of the model's linears (Phi-3's qkv_proj)
                        loaded |= _load_fused(name, f.get_tensor(stored), parts, params, file)
                    elif owner is not None:  # a module that takes it whole (the experts of an MoE layer)
                        owners[owner[0]] = owner[1]
                        load_owned_weight(name, owner, f.get_tensor(stored), file)
                    else:
                        unexpected.append(name)
                    continue
                # A sharded parameter's loader reads its part of the file, not the whole tensor.
                sliced = getattr(get_weight_loader(param), "reads_slices", False)
                load_named_weight(name, param, f.get_slice(stored) if sliced else f.get_tensor(stored), file)
                loaded.add(name)
    if quant is not None:
        loaded |= quant.finish()
    loaded |= {f"{prefix}.{p}" for prefix, module in owners.items() for p in module.loaded_params()}
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        raise ValueError(
            f"Checkpoint does not match the model: missing weights {name_list(missing)}; "
            f"unexpected weights {name_list(sorted(unexpected))}"
        )


def _load_fused(
    name: str, tensor: torch.Tensor, parts: list[tuple[str, int]], params: dict[str, nn.Parameter], file: str
) -> set[str]:
    """Each part's rows of a fused checkpoint tensor through that parameter's loader; the names loaded."""
    try:
        pieces = split_fused(tensor, parts)
    except WeightShapeError as err:
        raise ValueError(
            f"Weight {name} has shape {err.loaded_shape} in {file}, the model expects {err.expected_shape}"
        ) from None
    for part, piece in pieces:
        load_named_weight(name, params[part], piece, file)
    return {part for part, _ in pieces}


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights from the seed alone: N(0, 0.02) matrices, ones for norms, zeros for biases.

    For benchmarks and tests without a checkpoint; the same seed gives the same weights on a device.
    Drawing a billion normals takes seconds on a CPU, so matrices are tiled from one pool of
    normals at seeded offsets instead: a memory copy, with values that are still N(0, 0.02).
    """
    pool: torch.Tensor | None = None
    offsets = torch.Generator().manual_seed(seed)  # on the CPU: offsets are host ints
    for name, param in model.named_parameters():
        if pool is None:
            device_gen = torch.Generator(device=param.device).manual_seed(seed)
            normals = torch.randn(_DUMMY_POOL, generator=device_gen, device=param.device) * _DUMMY_STD
            normals = normals.to(param.dtype)  # a same-dtype copy is a plain memcpy
            pool = torch.cat((normals, normals))  # doubled so that any window of _DUMMY_POOL wraps around
        if param.dim() >= 2:
            start = int(torch.randint(_DUMMY_POOL, (1,), generator=offsets))
            _fill_from_pool(param.view(-1), pool, start)
        elif "norm" in name:
            param.fill_(1.0)
        else:
            param.zero_()


def _fill_from_pool(flat: torch.Tensor, pool: torch.Tensor, start: int) -> None:
    """flat[i] = pool[(start + i) % _DUMMY_POOL], copied a pool-length window at a time."""
    for begin in range(0, flat.numel(), _DUMMY_POOL):
        length = min(_DUMMY_POOL, flat.numel() - begin)
        offset = (start + begin) % _DUMMY_POOL
        flat[begin : begin + length].copy_(pool[offset : offset + length])
