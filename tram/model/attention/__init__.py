"""Attention backends: pick one by name; all implement `AttentionBackend` from base.py."""
from __future__ import annotations

from collections.abc import Callable

from tram.model.attention.base import AttentionBackend, AttentionMetadata


def _torch_backend() -> AttentionBackend:
    from tram.model.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


def _triton_backend() -> AttentionBackend:
    from tram.model.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()


# Name -> factory. Factories import lazily so that the GPU backend costs nothing, and fails
# nowhere, on machines that never select it (triton is imported only when its kernels first run).
_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": _torch_backend,
    "triton": _triton_backend,
}


def default_attention_backend(device_type: str) -> str:
    return "triton" if device_type == "cuda" else "torch"


def get_attention_backend(name: str) -> AttentionBackend:
    """A fresh backend instance for `name`; ValueError listing the supported names otherwise."""
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"Unknown attention backend {name!r}. Supported backends: {', '.join(sorted(_BACKENDS))}")
    return factory()


__all__ = ["AttentionBackend", "AttentionMetadata", "default_attention_backend", "get_attention_backend"]
