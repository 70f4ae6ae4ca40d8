"""One home for configuration: every setting is declared once (`EngineArgs`, `ServerArgs`), the
`tram` command line and the `LLM(...)` keywords derive from those declarations, and the resolved
configs each layer reads (`ModelConfig`, `CacheConfig`, `SchedulerConfig`, `EngineConfig`) live
here too. Nothing in this package imports torch, nor anything of Tram's outside it: the values a layer
owns are registered by that layer (registry.py) and named here as strings."""

from tram.config.engine import DEFAULT_CPU_KV_CACHE_BYTES, CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
from tram.config.engine_args import EngineArgs
from tram.config.model import DTYPES, LOAD_FORMATS, ModelConfig, load_hf_config, resolve_device, resolve_dtype
from tram.config.server_args import ServerArgs

__all__ = [
    "DEFAULT_CPU_KV_CACHE_BYTES",
    "DTYPES",
    "LOAD_FORMATS",
    "CacheConfig",
    "EngineArgs",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "ServerArgs",
    "load_hf_config",
    "resolve_device",
    "resolve_dtype",
]
