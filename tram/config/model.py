"""The model configuration: which weights, which dtype, which device, how long a context.

Torch-free, because the API server process builds it without torch; the engine core resolves
"auto" into concrete names (`resolve`) and the worker reads them as torch objects (`torch_dtype`,
`torch_device`), importing torch only there.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# dtype spellings users may pass -> the canonical torch name.
DTYPES: dict[str, str] = {
    "float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16", "half": "float16",
}
LOAD_FORMATS = ("auto", "safetensors", "dummy")
GGUF_ACTIVATIONS = ("float32", "int8")  # what a GGUF file's quantized linears multiply their weights with
CHECKPOINT_QUANTIZATION = ("gptq", "awq", "compressed-tensors")  # read from config.json, not made at load


def _canonical(value: Any) -> str:
    """torch.float32 and torch.device("cpu") become "float32" and "cpu"; strings stay as given."""
    return value if isinstance(value, str) else str(value).removeprefix("torch.")


def device_type(device: Any) -> str:
    """"cuda" for "cuda:1" or torch.device("cuda:1")."""
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
    that needs it loads its own copy from `model`.
    """

    model: str
    hf_config: Any = field(default=None, repr=False)
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int = 2048
    load_format: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False
    seed: int = 0
    attention_backend: str | None = None  # None: the device's default
    enforce_eager: bool = False  # no CUDA graphs
    # Weight-only: made at load from a float checkpoint (int8, int4), or read from a quantized one
    # (gptq, awq, compressed-tensors: detected from config.json's quantization_config).
    quantization: str | None = None
    gguf_activations: str = "float32"  # one of GGUF_ACTIVATIONS: a GGUF file's linears (EngineArgs says how)

    def __post_init__(self) -> None:
        self.dtype, self.device = _canonical(self.dtype), _canonical(self.device)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.hf_config is None:
            self.hf_config = load_hf_config(self.model, self.revision, self.trust_remote_code)
        self.quantization = checkpoint_quantization(self.hf_config, self.quantization)

    def __getstate__(self) -> dict[str, Any]:
        # A transformers config object pickles with its class, which the receiving process may have
        # imported differently (the API process keeps transformers torch-free); send the path instead.
        return {**self.__dict__, "hf_config": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.hf_config = load_hf_config(self.model, self.revision, self.trust_remote_code)

    def resolve(self) -> None:
        """Turn "auto" into this process's device, the dtype for it, and the device's attention
        backend (idempotent; imports torch)."""
        from tram.model.attention import default_attention_backend

        self.device = _canonical(resolve_device(self.device))
        self.dtype = _canonical(resolve_dtype(self.dtype, self.hf_config, self.device))
        if self.attention_backend is None:
            self.attention_backend = default_attention_backend(self.device_type)

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


def checkpoint_quantization(hf_config: Any, requested: str | None) -> str | None:
    """The quantization to run: the checkpoint's quant_method where its config has one (a requested
    method must then agree), else the requested one. ValueError on a disagreement."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        if requested in CHECKPOINT_QUANTIZATION:
            raise ValueError(f"quantization {requested!r} reads a {requested} checkpoint, but this model's "
                             "config.json has no quantization_config (for a float checkpoint choose int8 or int4)")
        return requested
    found = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    method = str(getattr(found, "value", found)).lower()  # transformers may hold an enum
    if requested is None or requested == method:
        return method
    if requested in ("int8", "int4"):
        raise ValueError(f"quantization {requested!r} quantizes a float checkpoint at load, but this checkpoint is "
                         f"already quantized ({method}); drop the quantization setting to serve it as it is")
    raise ValueError(f"quantization {requested!r} does not match the checkpoint's quantization_config "
                     f"(quant_method {method!r})")


def load_hf_config(model: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The transformers config of a local folder (or an already downloaded hub snapshot), or the
    config a GGUF file's metadata describes."""
    from transformers import AutoConfig

    from tram.model.gguf.file import is_gguf, load_gguf_config

    if is_gguf(model):
        return load_gguf_config(model)

    try:
        return AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"Could not load the config of model {model!r}: {err}") from err
