"""Where a model's files are: a local folder, or a Hugging Face hub snapshot downloaded (or found in
the local cache), or a GGUF file; and how its config is read. Torch-free: the API server process
resolves the model before the engine starts."""

from __future__ import annotations

import json
import os
from typing import Any

from tram.config.model import load_hf_config
from tram.model.gguf.file import is_gguf, load_gguf_config

INDEX_FILE = "model.safetensors.index.json"
# Everything but the weights: configs, tokenizer files (sentencepiece, BPE merges, tiktoken), chat templates.
_METADATA_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def resolve_model_path(model: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """A local folder holding the model's config, tokenizer and safetensors weights, or a local
    GGUF file.

    A local folder is used as is. Otherwise the hub snapshot is downloaded (or found in the local
    cache, or `download_dir`): metadata first, then only the weight files the index names, so that
    repos that also ship a consolidated checkpoint are not downloaded twice.
    """
    if os.path.isdir(model) or is_gguf(model):
        return model
    try:
        # Offline, snapshot_download itself falls back to a cached snapshot.
        return _download(model, revision, download_dir)
    except Exception as err:  # network, auth, unknown repo: all end in the same advice
        raise ValueError(
            f"Model {model!r} is not a local folder and could not be fetched from the Hugging Face hub "
            f"({type(err).__name__}: {err}). Pass a local path, check the name and the network, "
            "or log in (HF_TOKEN) for gated models."
        ) from err


def _download(model: str, revision: str | None, download_dir: str | None) -> str:
    from huggingface_hub import snapshot_download

    path = snapshot_download(model, revision=revision, allow_patterns=_METADATA_PATTERNS, cache_dir=download_dir)
    index = os.path.join(path, INDEX_FILE)
    weights = sorted(set(read_index(index).values())) if os.path.exists(index) else ["*.safetensors"]
    return snapshot_download(model, revision=revision, allow_patterns=weights, cache_dir=download_dir)


def read_index(index_path: str) -> dict[str, str]:
    """A sharded checkpoint's weight name -> file map."""
    with open(index_path) as f:
        return json.load(f)["weight_map"]


def config_reader(path: str) -> str | None:
    """ "module:attr" of the function that reads the config of the model at `path` where it is no
    Hugging Face folder (a GGUF file's metadata); None: transformers' AutoConfig reads it. ModelConfig
    carries it, so that every process it is sent to reads the config the same way."""
    if is_gguf(path):
        return f"{load_gguf_config.__module__}:{load_gguf_config.__qualname__}"
    return None


def read_hf_config(path: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The transformers config of a local folder (or downloaded hub snapshot), or of a GGUF file."""
    return load_hf_config(path, revision, trust_remote_code, config_reader(path))
