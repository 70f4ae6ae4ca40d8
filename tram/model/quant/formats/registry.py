"""The registry of checkpoint quantization formats: each format module registers its
`CheckpointFormat` by the quant_method names it claims (`@register`), when the formats package
imports it. Torch-free, as the formats are at import."""

from __future__ import annotations

from typing import Any

from tram.model.quant.formats.base import CheckpointFormat, CheckpointScheme

_FORMATS: list[CheckpointFormat] = []  # in registration order: the order messages name them
_BY_METHOD: dict[str, CheckpointFormat] = {}


def register(cls: type[CheckpointFormat]) -> type[CheckpointFormat]:
    """Class decorator: the format answers for each of its `methods` from now on."""
    fmt = cls()
    for method in fmt.methods:
        if method in _BY_METHOD:
            raise ValueError(f"quant_method {method!r} is claimed by both {_BY_METHOD[method].name} and {fmt.name}")
        _BY_METHOD[method] = fmt
    _FORMATS.append(fmt)
    return cls


def checkpoint_methods() -> tuple[str, ...]:
    """Every registered quant_method name, in registration order."""
    return tuple(_BY_METHOD)


def format_for(method: str | None) -> CheckpointFormat | None:
    """The format that reads checkpoints of quant_method `method` (None: no registered one)."""
    return _BY_METHOD.get(method) if method is not None else None


def format_names() -> str:
    """The formats as a sentence names them: "GPTQ, AWQ or compressed-tensors"."""
    names = [fmt.name for fmt in _FORMATS]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def unsupported(what: str) -> ValueError:
    """The error for a scheme Tram cannot run, naming it and everything Tram reads."""
    supported = ", ".join(fmt.supported for fmt in _FORMATS)
    return ValueError(f"quantized checkpoint: {what} is not supported; Tram reads {supported}")


def config_dict(hf_config: Any) -> dict[str, Any]:
    """The checkpoint's quantization_config as a dict ({} where it has none)."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return {}
    return config if isinstance(config, dict) else config.to_dict()


def parse_scheme(hf_config: Any) -> CheckpointScheme:
    """The checkpoint's quantization, or ValueError naming the unsupported scheme."""
    config = config_dict(hf_config)
    method = str(config.get("quant_method", "")).lower()
    fmt = _BY_METHOD.get(method)
    if fmt is None:
        raise unsupported(f"quant_method {method!r}")
    return CheckpointScheme(method, fmt, fmt.parse(config))
