"""A mixture of experts' tensors from a GGUF file: each projection of a layer's experts is one
tensor [E, N, K] (`blk.3.ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`), which fills FusedMoE's
stacked w13 = [gate; up] ([E, 2I, H]) and w2 ([E, H, I]).

On the CPU, a layer whose three tensors are of types GGUFWeight keeps (gate and up of one type, as
llama-quantize writes them) keeps them in their blocks: FusedMoE's `w13` / `w2` become
ExpertWeights of kind "gguf" ([E, N, row_bytes] uint8) and its float parameters are emptied, as
`FusedMoE.quantize_` does for int8/int4. Any other layer, and every layer off the CPU, is
dequantized into the float parameters, as the dense loader does for its tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from tram.model.gguf.names import ExpertTensor, expert_tensor
from tram.model.gguf.weight import GGUF_KEPT_TYPES, check_gguf_data, repack_for_int8
from tram.model.layers.moe.experts import ExpertWeights
from tram.model.layers.moe.layer import FusedMoE

logger = logging.getLogger(__name__)

Dequantize = Callable[[np.ndarray, int], torch.Tensor]  # (file data, ggml type) -> float tensor


def _expert_layers(model: nn.Module) -> dict[str, FusedMoE]:
    return {name: m for name, m in model.named_modules() if isinstance(m, FusedMoE)}


def _types_by_layer(tensors: list[Any]) -> dict[str, dict[tuple[str, int | None], int]]:
    """FusedMoE name -> (param, half) -> the ggml type of the file's tensor for it."""
    types: dict[str, dict[tuple[str, int | None], int]] = {}
    for t in tensors:
        where = expert_tensor(t.name)
        if where is not None and where.kind == "weight":
            types.setdefault(where.module, {})[(where.param, where.half)] = int(t.tensor_type)
    return types


def _keeps_blocks(types: dict[tuple[str, int | None], int]) -> bool:
    gate, up, down = types.get(("w13", 0)), types.get(("w13", 1)), types.get(("w2", None))
    return gate == up and gate in GGUF_KEPT_TYPES and down in GGUF_KEPT_TYPES


def plan_experts(model: nn.Module, tensors: list[Any]) -> None:
    """On the meta-device model: the FusedMoE layers whose experts stay in their blocks give up
    their float parameters (so no float copy is allocated)."""
    layers = _expert_layers(model)
    for name, types in _types_by_layer(tensors).items():
        moe = layers.get(name)
        if moe is None:
            continue
        if not _keeps_blocks(types):
            logger.debug("GGUF experts of %s: types %s are dequantized at load", name, sorted(set(types.values())))
            continue
        for param in ("w13_weight", "w2_weight"):
            old = getattr(moe, param)
            setattr(moe, param, nn.Parameter(torch.empty(0, dtype=old.dtype, device="meta"), requires_grad=False))


class ExpertLoader:
    """Takes a file's stacked expert tensors one at a time (load_gguf_weights' loop) into the model's
    FusedMoE layers; `loaded_names` says which parameters are then complete."""

    def __init__(
        self, model: nn.Module, path: str, hidden_size: int, dequantize: Dequantize, int8_activations: bool = False
    ) -> None:
        self.layers = _expert_layers(model)
        self.int8_activations = int8_activations
        self.hidden = hidden_size
        self.path = path
        self.dequantize = dequantize
        self.received: dict[str, set[tuple[str, int | None, str]]] = {}  # (param, half, weight/bias)
        self.halves: dict[str, dict[int, tuple[np.ndarray, int]]] = {}  # kept w13 halves until both came

    def load(self, t: Any, where: ExpertTensor) -> bool | None:
        """Fill the part of a FusedMoE that tensor t is: True where it stays in its blocks, False where
        it became float, None where the model has no such layer (another pipeline stage's, or none)."""
        moe = self.layers.get(where.module)
        if moe is None:
            return None
        if where.kind == "bias":
            self._bias(t, moe, where)
            return False
        self._check_shape(t, moe, where)
        self.received.setdefault(where.module, set()).add((where.param, where.half, "weight"))
        if moe.w2_weight.numel() == 0:  # planned to stay in its blocks
            self._keep(t, moe, where)
            return True
        tensor = self.dequantize(t.data, int(t.tensor_type))
        param = getattr(moe, f"{where.param}_weight")
        if where.half is None:
            param.copy_(tensor)
        else:
            param[:, where.half * moe.width : (where.half + 1) * moe.width].copy_(tensor)
        return False

    def loaded_names(self) -> set[str]:
        names = set()
        for module, got in self.received.items():
            for kind in ("weight", "bias"):
                if {("w13", 0, kind), ("w13", 1, kind)} <= got:
                    names.add(f"{module}.w13_{kind}")
                if ("w2", None, kind) in got:
                    names.add(f"{module}.w2_{kind}")
        return names

    def _bias(self, t: Any, moe: FusedMoE, where: ExpertTensor) -> None:
        """An expert bias [E, N] (gpt-oss) into w13_bias's half or w2_bias."""
        param = getattr(moe, f"{where.param}_bias")
        rows = moe.width if where.param == "w13" else self.hidden
        want = (moe.spec.num_experts, rows)
        got = tuple(int(d) for d in reversed(t.shape))
        if param is None or got != want:
            takes = "no bias" if param is None else f"{want}"
            raise ValueError(
                f"Tensor {t.name} in {self.path} has shape {got} (experts, rows); {where.module} takes {takes}"
            )
        tensor = self.dequantize(t.data, int(t.tensor_type)).reshape(want)
        if where.half is None:
            param.copy_(tensor)
        else:
            param[:, where.half * moe.width : (where.half + 1) * moe.width].copy_(tensor)
        self.received.setdefault(where.module, set()).add((where.param, where.half, "bias"))

    def _check_shape(self, t: Any, moe: FusedMoE, where: ExpertTensor) -> None:
        """The tensor's (experts, rows, row length), ggml's ne reversed, against the layer's (one rank
        holds every expert of a GGUF model)."""
        rows, length = (moe.width, self.hidden) if where.param == "w13" else (self.hidden, moe.width)
        want = (moe.spec.num_experts, rows, length)
        got = tuple(int(d) for d in reversed(t.shape))
        if got != want:
            raise ValueError(
                f"Tensor {t.name} in {self.path} has shape {got} (experts, rows, row length); "
                f"{where.module}.{where.param} takes {want}"
            )

    def _keep(self, t: Any, moe: FusedMoE, where: ExpertTensor) -> None:
        qtype = int(t.tensor_type)
        if where.half is None:
            moe.w2 = self._blocks(t.name, [t.data], qtype, int(t.shape[0]))
            return
        halves = self.halves.setdefault(where.module, {})
        halves[where.half] = (t.data, qtype)  # the file's map until its other half comes
        if len(halves) == 2:
            (gate, gate_type), (up, up_type) = halves.pop(0), halves.pop(1)
            if gate_type != up_type:  # plan_experts saw one type for both
                raise ValueError(f"{self.path}: {where.module}'s gate and up experts have different types")
            moe.w13 = self._blocks(t.name, [gate, up], qtype, int(t.shape[0]))

    def _blocks(self, name: str, parts: list[np.ndarray], qtype: int, in_features: int) -> ExpertWeights:
        """ExpertWeights of kind "gguf" from [E, N, row_bytes] parts stacked along N (a private copy)."""
        data = torch.from_numpy(np.concatenate(parts, axis=1))
        experts, rows, row_bytes = data.shape
        try:
            check_gguf_data(data.view(experts * rows, row_bytes), qtype, in_features)
        except ValueError as err:
            raise ValueError(f"Tensor {name} in {self.path}: {err}") from err
        if self.int8_activations and all(part.shape[1] % 8 == 0 for part in parts):  # whole groups per part
            data, qtype = repack_for_int8(data, qtype, experts=True)
        return ExpertWeights("gguf", data, rows, in_features, ggml_type=qtype, int8_activations=self.int8_activations)
