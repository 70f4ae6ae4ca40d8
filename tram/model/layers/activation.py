"""Activations by their Hugging Face config names, computed as transformers' ACT2FN computes them."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Activation = Callable[[torch.Tensor], torch.Tensor]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
}


def check_activation(name: str) -> str:
    """name if supported; ValueError listing the supported ones otherwise."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return name


def get_activation(name: str) -> Activation:
    return ACTIVATIONS[check_activation(name)]
