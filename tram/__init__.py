"""Tram: an LLM inference and serving engine with a paged KV cache and continuous batching.

Public names load lazily so that `tram.core` (scheduler, block pool) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from tram.logger import configure_logging
from tram.version import __version__ as __version__

configure_logging()

_EXPORTS = {
    "LLM": "tram.entrypoints.llm",
    "LLMEngine": "tram.engine.llm_engine",
    "EngineArgs": "tram.config",
    "SamplingParams": "tram.sampling_params",
    "StructuredOutputsParams": "tram.sampling_params",
    "RequestOutput": "tram.outputs",
    "CompletionOutput": "tram.outputs",
    "Logprob": "tram.outputs",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tram' has no attribute {name!r}")
