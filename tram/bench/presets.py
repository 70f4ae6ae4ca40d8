"""Model presets (config-only folders with realistic shapes) and seeded random checkpoints made from them.

With `--load-format dummy` Tram fills a preset with random weights itself. Peers that can only load a
checkpoint (transformers, llama.cpp's converter) get one materialised once from the same preset and
seed, and every backend of a comparison then loads those same files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import tram.envs as envs

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
CHECKPOINT_CACHE: Path = envs.TRAM_BENCH_CACHE
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")


def preset_names() -> list[str]:
    return sorted(p.name for p in PRESETS_DIR.iterdir() if (p / "config.json").exists())


def resolve_model(model: str) -> str:
    """A preset's name becomes its folder; anything else (a path, a hub id) passes through."""
    if (PRESETS_DIR / model / "config.json").exists() and not Path(model).exists():
        return str(PRESETS_DIR / model)
    return model


def is_config_only(model: str) -> bool:
    path = Path(model)
    return path.is_dir() and not any(path.glob("*.safetensors")) and not any(path.glob("*.bin"))


def materialize(model: str, dtype: str = "float32", seed: int = 0) -> str:
    """A safetensors checkpoint with seeded random weights for a config-only folder (cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src = Path(model).resolve()
    out = CHECKPOINT_CACHE / f"{src.name}-{dtype}-seed{seed}"
    if (out / "model.safetensors").exists() or any(out.glob("model-*.safetensors")):
        return str(out)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(src)
    net = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    tmp = out.with_name(out.name + ".tmp")
    net.save_pretrained(tmp)
    for name in _TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, tmp / name)
    tmp.rename(out)  # only a finished checkpoint is ever found in the cache
    return str(out)


def checkpoint_for(model: str, dtype: str = "float32", seed: int = 0, random_weights: bool = False) -> str:
    """The checkpoint every backend of a comparison loads: a preset's folder, or a config-only one, or any
    model with `random_weights`, gets seeded random weights materialised once, because peers cannot load
    Tram's 'dummy' format and all must run the same weights; anything else passes through."""
    model = resolve_model(model)
    if is_config_only(model) or random_weights:
        return materialize(model, dtype, seed)
    return model
