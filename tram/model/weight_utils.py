"""The per-parameter weight loader: the one seam between checkpoint tensors and model parameters.

Contract of a weight loader, `weight_loader(param, loaded) -> None`:
  * The loading loop (loader.load_safetensors_weights) calls it once for every checkpoint tensor whose
    name is the parameter's name, with gradients off. `loaded` is a CPU tensor in the checkpoint's
    dtype, possibly backed by the memory-mapped file: read it, never keep it. A loader with a true
    `reads_slices` attribute (a tensor-parallel shard) gets a safetensors slice instead (get_shape(),
    indexing), so that it reads only its part of the file.
  * It fills `param` in place (`param.copy_`, `param[...].copy_`, or `param.narrow(...)`), casting
    dtype and moving device as needed. It never rebinds `param.data`: the model may hold views of it.
  * It raises WeightShapeError (or another ValueError) when it cannot use the tensor; the loop adds
    the weight's name and file to the message.
  * The parameter counts as loaded once its loader has returned; a parameter no checkpoint tensor
    reached is reported as missing.

A parameter with no `weight_loader` attribute gets `default_weight_loader`: an exact-shape copy.
Layers attach their own with `set_weight_loader` where a parameter is not the checkpoint tensor as
is: a tensor-parallel shard (a slice of `loaded`), a quantized packing, or a fused parameter filled
from several checkpoint tensors (fused q/k/v, gate/up: such a loader takes the shard as a third
argument, bound by the model's mapping of checkpoint names to parameter names). The other way
round, a checkpoint tensor that stacks several of the model's linears (Phi-3's qkv_proj) is cut
into them first (`fused_parts`, `split_fused`), each part then going through its parameter's loader.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

WeightLoader = Callable[[nn.Parameter, torch.Tensor], None]


class WeightShapeError(ValueError):
    """A checkpoint tensor whose shape the parameter cannot take."""

    def __init__(self, loaded_shape: tuple[int, ...], expected_shape: tuple[int, ...]) -> None:
        super().__init__(f"has shape {loaded_shape}, the model expects {expected_shape}")
        self.loaded_shape = loaded_shape
        self.expected_shape = expected_shape


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy the whole tensor into the parameter (cast to its dtype and device); shapes must match."""
    if loaded.shape != param.shape:
        raise WeightShapeError(tuple(loaded.shape), tuple(param.shape))
    param.copy_(loaded)


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> nn.Parameter:
    """Attach `loader` to `param` (returned, for use in assignments)."""
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


def get_weight_loader(param: nn.Parameter) -> WeightLoader:
    return getattr(param, "weight_loader", default_weight_loader)


def materialize(model: nn.Module, device: torch.device | str) -> None:
    """Allocate (uninitialised) storage on `device` for a model built on the meta device.

    As `Module.to_empty`, one new Parameter per module entry, keeping the old one's attributes (such
    as `weight_loader`). Not to_empty itself: its `empty_like` of a meta tensor runs torch's Python
    reference op, whose first use imports torch's symbolic-shapes machinery (a quarter of a second
    of every process start).
    """
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                new = nn.Parameter(_empty(param, device), requires_grad=param.requires_grad)
                vars(new).update(vars(param))
                module._parameters[name] = new
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = _empty(buffer, device)


def _empty(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)


def load_named_weight(name: str, param: nn.Parameter, tensor: torch.Tensor, file: str) -> None:
    """param's weight_loader on tensor; a ValueError names the weight, the file and the shapes."""
    try:
        get_weight_loader(param)(param, tensor)
    except WeightShapeError as err:
        raise ValueError(
            f"Weight {name} has shape {err.loaded_shape} in {file}, the model expects {err.expected_shape}"
        ) from None
    except ValueError as err:
        raise ValueError(f"Weight {name} in {file}: {err}") from err


def name_list(names: list[str], limit: int = 10) -> str:
    """'a, b, c and 7 more' (or 'none'): weight names in a load error."""
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def fused_parts(model: nn.Module, name: str) -> list[tuple[str, int]]:
    """(parameter name, full rows) of each of the model's linears that the checkpoint tensor `name`
    fuses, in the order the tensor stacks them; [] when `name` fuses none.

    A family whose checkpoint stacks several linears in one tensor (Phi-3's qkv_proj, gate_up_proj)
    names them in its `fused_weights` ({"qkv_proj": ("q_proj", "k_proj", "v_proj")}) and keeps
    Tram's separate layers, so that tensor-parallel shards, the CPU's stacked gate/up and quantization
    work on them unchanged. Full rows: the whole layer's, also where a rank holds a shard of it.
    """
    module_name, _, param = name.rpartition(".")  # model.layers.0.self_attn.qkv_proj, weight
    owner, _, fused = module_name.rpartition(".")
    parts = getattr(model, "fused_weights", {}).get(fused, ())
    found = []
    for part in parts:
        try:
            linear = model.get_submodule(f"{owner}.{part}")
        except AttributeError:
            return []
        shard = getattr(linear, "shard", None)
        found.append((f"{owner}.{part}.{param}", shard.full if shard is not None else linear.out_features))
    return found


def split_fused(loaded: torch.Tensor, parts: list[tuple[str, int]]) -> list[tuple[str, torch.Tensor]]:
    """The rows of a fused checkpoint tensor that each part takes (see fused_parts), as views."""
    total = sum(rows for _, rows in parts)
    if loaded.shape[0] != total:
        raise WeightShapeError(tuple(loaded.shape), (total, *loaded.shape[1:]))
    pieces = []
    start = 0
    for part, rows in parts:
        pieces.append((part, loaded.narrow(0, start, rows)))
        start += rows
    return pieces


def checkpoint_rename(model: nn.Module, name: str) -> str:
    """A checkpoint name in the model's own naming: each (old, new) of the family's
    `checkpoint_renames` replaced (Mixtral's `.block_sparse_moe.` is Tram's `.mlp.`)."""
    for old, new in getattr(model, "checkpoint_renames", ()):
        name = name.replace(old, new)
    return name


def checkpoint_owner(modules: dict[str, nn.Module], name: str) -> tuple[str, nn.Module] | None:
    """(prefix, module) of the innermost module above `name` that takes checkpoint tensors itself
    (a `load_checkpoint_tensor(rest_of_name, tensor)` method, such as an MoE layer's experts,
    whose many per-expert tensors fill a few stacked parameters); None if there is none.

    Such a module also has `loaded_params()`: the local names of its parameters that are complete."""
    prefix = name
    while "." in prefix:
        prefix = prefix.rpartition(".")[0]
        module = modules.get(prefix)
        if module is not None and hasattr(module, "load_checkpoint_tensor"):
            return prefix, module
    return None


def load_owned_weight(name: str, owner: tuple[str, nn.Module], tensor: torch.Tensor, file: str) -> None:
    """The owner's load_checkpoint_tensor on tensor; a ValueError names the weight and the file."""
    prefix, module = owner
    try:
        module.load_checkpoint_tensor(name[len(prefix) + 1 :], tensor)
    except WeightShapeError as err:
        raise ValueError(
            f"Weight {name} has shape {err.loaded_shape} in {file}, the model expects {err.expected_shape}"
        ) from None
    except ValueError as err:
        raise ValueError(f"Weight {name} in {file}: {err}") from err
