"""Attention backends: registered by name (configuration's ATTENTION_BACKENDS), built by
`get_attention_backend`; all implement `AttentionBackend` from base.py.

Importing this package registers the names without importing torch (the API process lists them in
`tram serve --help`): each backend's module, and base.py's types, load on first use. The GPU
backend so costs nothing, and fails nowhere, on machines that never select it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tram.config.registry import ATTENTION_BACKENDS

if TYPE_CHECKING:
    from tram.model.attention.base import AttentionBackend, AttentionMetadata

ATTENTION_BACKENDS.add(
    "torch",
    "PyTorch and the C++ CPU kernels; the default off CUDA",
    target="tram.model.attention.torch_backend:TorchAttentionBackend",
)
ATTENTION_BACKENDS.add(
    "triton", "Triton kernels; the default on CUDA", target="tram.model.attention.triton_backend:TritonAttentionBackend"
)


@ATTENTION_BACKENDS.set_default
def default_attention_backend(device_type: str) -> str:
    return "triton" if device_type == "cuda" else "torch"


@ATTENTION_BACKENDS.add_check
def check_attention_backend(name: str, settings: Any = None) -> None:
    """ValueError naming the registered backends for any other name."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"Unknown attention backend {name!r}. Supported backends: {', '.join(ATTENTION_BACKENDS)}")


def get_attention_backend(name: str) -> AttentionBackend:
    """A fresh backend instance for `name`; ValueError listing the registered names otherwise."""
    check_attention_backend(name)
    return ATTENTION_BACKENDS.load(name)()


def __getattr__(name: str) -> Any:
    if name in ("AttentionBackend", "AttentionMetadata"):
        return getattr(importlib.import_module("tram.model.attention.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AttentionBackend", "AttentionMetadata", "default_attention_backend", "get_attention_backend"]
