"""Model configuration: which weights, which dtype, which device, how long a context."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
LOAD_FORMATS = ("auto", "safetensors", "dummy")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, hf_config: Any, device: torch.device) -> torch.dtype:
    """'auto' takes the checkpoint's dtype, except float16 on CPU (slow half matmuls) and float32 on
    CUDA both become bfloat16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
        return _DTYPES[dtype]
    cfg_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(cfg_dtype, str):
        cfg_dtype = _DTYPES.get(cfg_dtype, torch.float32)
    if cfg_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        cfg_dtype = torch.float32
    if cfg_dtype == torch.float16 and device.type == "cpu":
        logger.info("float16 checkpoint on CPU: running in bfloat16")
        return torch.bfloat16
    if cfg_dtype == torch.float32 and device.type == "cuda":
        # float32 serving wastes half the memory bandwidth that decode is bound by.
        logger.info("float32 checkpoint on CUDA: running in bfloat16 (pass dtype='float32' to keep it)")
        return torch.bfloat16
    return cfg_dtype


@dataclass
class ModelConfig:
    """Everything the worker needs to build and load the model."""

    model: str
    hf_config: Any  # transformers.PretrainedConfig
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    load_format: str = "auto"
    revision: str | None = None
    seed: int = 0
    attention_backend: str = "torch"
    enforce_eager: bool = False  # no CUDA graphs

    @property
    def architecture(self) -> str:
        archs = getattr(self.hf_config, "architectures", None) or []
        return archs[0] if archs else ""

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)
