"""The gated MLP of Llama-style decoders: down(act(gate(x)) * up(x)), activation chosen by config."""
from __future__ import annotations

import torch
from torch import nn

from tram.model.layers.activation import get_activation
from tram.model.linear import Linear, linear_n


class GatedMLP(nn.Module):
    """SwiGLU with silu (Llama, Qwen), GeGLU with gelu_pytorch_tanh (Gemma)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias, dtype=dtype)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias, dtype=dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias, dtype=dtype)
        self.act = get_activation(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        gate, up = linear_n(x, (self.gate_proj, self.up_proj))  # one skinny-kernel call for both on CPU
        return self.down_proj(self.act(gate) * up)
