"""The model configuration: which weights, which dtype, which device, how long a context.

Torch-free, because the API server process builds it without torch; the engine core resolves
"auto" into concrete names (`resolve`) and the worker reads them as torch objects (`torch_dtype`,
`torch_device`), importing torch only there.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from tram.config.engine_args import DTYPES, FALLBACK_MAX_MODEL_LEN, LOAD_FORMATS, EngineArgs
from tram.config.hf_snapshot import HFConfigSnapshot, snapshot_hf_config
from tram.config.registry import ATTENTION_BACKENDS, import_target

logger = logging.getLogger(__name__)
__all__ = [
    "DTYPES",
    "LOAD_FORMATS",
    "ModelConfig",
    "checkpoint_quant_method",
    "device_type",
    "load_hf_config",
    "resolve_device",
    "resolve_dtype",
]


def _canonical(value: Any) -> str:
    """torch.float32 and torch.device("cpu") become "float32" and "cpu"; strings stay as given."""
    return value if isinstance(value, str) else str(value).removeprefix("torch.")


def device_type(device: Any) -> str:
    """ "cuda" for "cuda:1" or torch.device("cuda:1")."""
    return _canonical(device).split(":")[0]


def resolve_device(device: Any) -> Any:
    """The torch.device to run on: 'auto' is CUDA when this process can see a GPU, else the CPU."""
    import torch

    if _canonical(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(_canonical(device))


def resolve_dtype(dtype: Any, hf_config: Any, device: Any) -> Any:
    """The torch.dtype to run in. 'auto' takes the checkpoint's dtype, except float16 on CPU (slow
    half matmuls) and float32 on CUDA, which both become bfloat16."""
    import torch

    name = _canonical(dtype)
    if name != "auto":
        return getattr(torch, DTYPES[name])
    cfg_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    name = DTYPES.get(_canonical(cfg_dtype), "float32") if cfg_dtype is not None else "float32"
    if name == "float16" and device_type(device) == "cpu":
        logger.info("float16 checkpoint on CPU: running in bfloat16")
        name = "bfloat16"
    elif name == "float32" and device_type(device) == "cuda":
        # float32 serving wastes half the memory bandwidth that decode is bound by.
        logger.info("float32 checkpoint on CUDA: running in bfloat16 (pass dtype='float32' to keep it)")
        name = "bfloat16"
    return getattr(torch, name)


@dataclass
class ModelConfig:
    """Everything the worker needs to build and load the model.

    `dtype` and `device` are names ("auto" until `resolve`); torch.dtype / torch.device values are
    accepted and stored by name. `hf_config` (a transformers config) is not pickled: each process
    that needs it loads its own copy from `model`, with `config_reader` where the model layer gave
    one (a GGUF file's: "module:attr" of a function path -> config; None: a Hugging Face folder),
    unless it is a snapshot (`for_workers`), which travels as plain data. Defaults are EngineArgs'.
    """

    model: str
    hf_config: Any = field(default=None, repr=False)
    dtype: str = EngineArgs.dtype
    device: str = EngineArgs.device
    max_model_len: int = FALLBACK_MAX_MODEL_LEN  # the engine sets it from EngineArgs and the model
    load_format: str = EngineArgs.load_format
    revision: str | None = EngineArgs.revision
    trust_remote_code: bool = EngineArgs.trust_remote_code
    seed: int = EngineArgs.seed
    attention_backend: str | None = EngineArgs.attention_backend  # None: the device's default (resolve)
    enforce_eager: bool = EngineArgs.enforce_eager  # no CUDA graphs
    # Weight-only: made at load from a float checkpoint (int8, int4), or read from a quantized one
    # (its config.json's quantization_config names it; filled in from there when None).
    quantization: str | None = EngineArgs.quantization
    gguf_activations: str = EngineArgs.gguf_activations  # a GGUF file's linears (EngineArgs says how)
    config_reader: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.dtype, self.device = _canonical(self.dtype), _canonical(self.device)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.hf_config is None:
            self.hf_config = self._load_hf_config()
        if self.quantization is None:
            self.quantization = checkpoint_quant_method(self.hf_config)

    def _load_hf_config(self) -> Any:
        return load_hf_config(self.model, self.revision, self.trust_remote_code, self.config_reader)

    def __getstate__(self) -> dict[str, Any]:
        # A transformers config object pickles with its class, which the receiving process may have
        # imported differently (the API process keeps transformers torch-free); send the path instead.
        snapshot = self.hf_config if isinstance(self.hf_config, HFConfigSnapshot) else None
        return {**self.__dict__, "hf_config": snapshot}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.hf_config is None:
            self.hf_config = self._load_hf_config()

    def for_workers(self) -> ModelConfig:
        """This config with `hf_config` as a snapshot: what the engine sends the processes that only
        build the model from it (loading a transformers config there would import transformers)."""
        return dataclasses.replace(self, hf_config=snapshot_hf_config(self.hf_config))

    def resolve(self) -> None:
        """Turn "auto" into this process's device, the dtype for it, and the attention backend the
        model layer registered as the device's default (idempotent; imports torch)."""
        self.device = _canonical(resolve_device(self.device))
        self.dtype = _canonical(resolve_dtype(self.dtype, self.hf_config, self.device))
        if self.attention_backend is None:
            self.attention_backend = ATTENTION_BACKENDS.default(self.device_type)

    @property
    def device_type(self) -> str:
        return device_type(self.device)

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_device(self) -> Any:
        import torch

        return torch.device(self.device)

    @property
    def architecture(self) -> str:
        archs = getattr(self.hf_config, "architectures", None) or []
        return archs[0] if archs else ""

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)


def checkpoint_quant_method(hf_config: Any) -> str | None:
    """The quant_method of a quantized checkpoint's quantization_config (None: a float checkpoint).
    Whether Tram runs it, and whether it agrees with a requested method, is the model layer's check."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    found = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(found, "value", found)).lower()  # transformers may hold an enum


def load_hf_config(
    model: str, revision: str | None = None, trust_remote_code: bool = False, reader: str | None = None
) -> Any:
    """The transformers config of a local folder (or an already downloaded hub snapshot), or what
    `reader` ("module:attr" of a function path -> config, given by the model layer) reads."""
    if reader is not None:
        return import_target(reader)(model)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"Could not load the config of model {model!r}: {err}") from err
