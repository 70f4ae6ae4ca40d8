"""A transformers model config as plain data, for the worker processes that only read it.

Unpickling a transformers config imports its class's module, and in a process with torch that
pulls in most of transformers (its activations, and through them torch.distributed.tensor): over
a second and a half of every worker's start, for a dozen numbers the model reads. The engine,
which loaded the config, sends each worker a snapshot instead: every value the config answers
(its own fields, its class's aliases and properties), sub-configs as snapshots of their own. Model
code reads it as it reads the config, by attribute.

No transformers import here: a config is recognised by what it offers.
"""

from __future__ import annotations

import enum
import importlib
import logging
import warnings
from typing import Any


class HFConfigSnapshot:
    """The values of a transformers PretrainedConfig, read by attribute (a missing one raises
    AttributeError, so `getattr(config, name, default)` behaves as on the config).

    `to_hf_config()` rebuilds the transformers config itself (importing transformers), for the
    code that hands the config to transformers' own functions (RoPE scalings other than the default)."""

    def __init__(self, values: dict[str, Any], source: tuple[str, str, dict[str, Any]] | None = None) -> None:
        self.__dict__.update(values)
        self._source = source  # (module, class name, the config's to_dict())

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> Any:
        """The text model's config of a multimodal one (its `text_config`), else this config."""
        for name in ("text_config", "decoder", "generator", "text_encoder"):
            sub = self.__dict__.get(name)
            if isinstance(sub, HFConfigSnapshot):
                return sub
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            k: v.to_dict() if isinstance(v, HFConfigSnapshot) else v
            for k, v in self.__dict__.items()
            if not k.startswith("_")
        }

    def to_hf_config(self) -> Any:
        if self._source is None:
            raise ValueError("this config snapshot does not say which transformers config it was taken from")
        module, name, values = self._source
        return getattr(importlib.import_module(module), name).from_dict(values)

    def __repr__(self) -> str:
        return f"HFConfigSnapshot(model_type={self.__dict__.get('model_type')!r})"


def _is_hf_config(value: Any) -> bool:
    return not isinstance(value, type) and hasattr(value, "get_text_config") and hasattr(value, "to_json_string")


def snapshot_hf_config(config: Any) -> HFConfigSnapshot:
    """Every public value `config` answers to, taken now (an existing snapshot is returned as is).
    Values only transformers can unpickle (its classes, views over the config) are left out."""
    if isinstance(config, HFConfigSnapshot):
        return config
    values = {name: value for name, value in vars(config).items() if not name.startswith("_")}
    # Aliases (attribute_map) and properties live on the class; read each through the config.
    names = set(getattr(type(config), "attribute_map", {}) or {})
    for cls in type(config).__mro__:
        names.update(n for n, v in vars(cls).items() if isinstance(v, property) and not n.startswith("_"))
    hf_logger = logging.getLogger("transformers")
    level, hf_logger.level = hf_logger.level, logging.ERROR  # deprecated aliases log when read
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in names - values.keys():
                try:
                    values[name] = getattr(config, name)
                except Exception:  # noqa: BLE001 - a property this config cannot answer is one it lacks
                    continue
    finally:
        hf_logger.level = level
    plain = {name: _plain(value) for name, value in values.items()}
    source = (type(config).__module__, type(config).__qualname__, _plain(config.to_dict()))
    return HFConfigSnapshot({name: value for name, value in plain.items() if value is not _LEFT_OUT}, source)


_LEFT_OUT = object()


def _plain(value: Any) -> Any:
    if _is_hf_config(value):
        return snapshot_hf_config(value)
    if hasattr(value, "to_dict") and hasattr(value, "quant_method"):  # a quantization config object
        return _plain(value.to_dict())
    if isinstance(value, enum.Enum):  # transformers' own enums (QuantizationMethod) by their value
        return _plain(value.value)
    if isinstance(value, dict):
        items = {k: _plain(v) for k, v in value.items()}
        return _LEFT_OUT if _LEFT_OUT in items.values() else items
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        return _LEFT_OUT if _LEFT_OUT in items else items
    if isinstance(value, tuple):
        plain = _plain(list(value))
        return plain if plain is _LEFT_OUT else tuple(plain)
    owner = value if isinstance(value, type) else type(value)
    if owner.__module__.split(".")[0] in ("transformers", "huggingface_hub"):
        return _LEFT_OUT
    return value
