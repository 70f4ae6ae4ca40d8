"""A GGUF file (llama.cpp's format) read as a model: its metadata as a transformers config, its
tensors under the Hugging Face names Tram's models use.

Torch-free: the API server process builds the config of `tram serve model.gguf` before the engine
core starts. reader.py parses the file (a memory map; nothing is read until used).

What a GGUF file holds differently from a Hugging Face folder:
  * tensor names (`blk.3.attn_q.weight`) and reversed shapes (ggml's ne order: [K, N]), per
    architecture (names.py);
  * Llama-family q/k rows permuted for llama.cpp's interleaved RoPE, Gemma's norms plus one
    (names.py says which; loader.py undoes both);
  * settings as llama.cpp's metadata keys, some as tensors (RoPE factors), some only implied by the
    architecture (Gemma's layer pattern): archs.py turns them into each family's config;
  * no `output.weight` when the LM head is tied to the token embedding.
"""

from __future__ import annotations

import logging
import math
import os
from functools import lru_cache
from typing import Any

from tram.model.gguf.archs import ARCHITECTURES, Meta, decimal, served_architecture

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"


def is_gguf(model: str) -> bool:
    return model.endswith(GGUF_SUFFIX) and os.path.isfile(model)


@lru_cache(maxsize=4)
def _reader(path: str, mtime: float) -> Any:
    from tram.model.gguf.reader import GGUFFile

    try:
        reader = GGUFFile(path)
    except Exception as err:  # noqa: BLE001 - struct, numpy and value errors all mean a broken file
        if "unknown tensor type" in str(err):
            raise ValueError(
                f"{path} holds an {err}: written by a newer llama.cpp than the installed gguf "
                "package knows (pip install -U gguf)"
            ) from err
        raise ValueError(f"{path} is not a readable GGUF file ({type(err).__name__}: {err})") from err
    _check_extent(reader, path)
    return reader


def open_gguf(path: str) -> Any:
    """The parsed file (reader.GGUFFile, cached); ValueError for a broken file."""
    return _reader(path, os.path.getmtime(path))


def close_gguf() -> None:
    """Drop the cached readers (and with them the file maps, once their arrays are gone)."""
    _reader.cache_clear()


def _check_extent(reader: Any, path: str) -> None:
    """A truncated download parses (the header is whole) but its last tensors are cut short."""
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ValueError(
                f"{path} is truncated: tensor {t.name} needs bytes up to "
                f"{t.data_offset + t.n_bytes}, the file has {size}"
            )


def field(reader: Any, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def gguf_architecture(reader: Any, path: str) -> str:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} in {path} is not supported: Tram serves {', '.join(sorted(ARCHITECTURES))}"
        )
    return arch


def load_gguf_config(path: str) -> Any:
    """A transformers config equivalent to the GGUF metadata (what llama.cpp reads from it), with
    `architectures` set so that Tram's registry finds the model class."""
    import transformers

    reader = open_gguf(path)
    arch = gguf_architecture(reader, path)
    served = served_architecture(reader.fields, arch)
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ValueError(f"{path} has no token_embd.weight tensor: not a complete model")
    kwargs = _common_kwargs(reader, arch, names, path)
    kwargs["architectures"] = [served.hf_architecture]
    if served.extras is not None:
        kwargs.update(served.extras(Meta(reader.fields, arch, names, path), kwargs))
    return getattr(transformers, served.config_class)(**kwargs)


def _common_kwargs(reader: Any, arch: str, names: dict[str, Any], path: str) -> dict[str, Any]:
    """The config keywords every family's metadata gives the same way."""
    hidden = int(field(reader, f"{arch}.embedding_length"))
    heads = int(field(reader, f"{arch}.attention.head_count"))
    return dict(
        vocab_size=int(names["token_embd.weight"].shape[1]),  # ggml order: [hidden, vocab]
        hidden_size=hidden,
        intermediate_size=int(field(reader, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(field(reader, f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        rms_norm_eps=decimal(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        head_dim=int(field(reader, f"{arch}.attention.key_length", hidden // heads)),
        torch_dtype="float32",  # ggml computes in float32; the dequantized weights are float32 values
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=field(reader, "tokenizer.ggml.padding_token_id"),  # not the config class's default
        rope_parameters=_rope_parameters(reader, arch, names, path),
        # Qwen2's q/k/v always have biases (its class says so); an o_proj bias means attention_bias.
        attention_bias="blk.0.attn_output.bias" in names,
        mlp_bias="blk.0.ffn_down.bias" in names,
    )


def _rope_parameters(reader: Any, arch: str, names: dict[str, Any], path: str) -> dict[str, Any]:
    """transformers' rope_parameters: the base frequency, and linear scaling when the file has it."""
    params: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": decimal(field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        params.update(rope_type="linear", factor=decimal(field(reader, f"{arch}.rope.scaling.factor")))
    elif kind == "yarn":
        params.update(_yarn(reader, arch, path))
    elif kind not in ("none", None):
        raise ValueError(f"{path}: RoPE scaling {kind!r} in GGUF files is not supported yet (linear and yarn are)")
    if "rope_freqs.weight" in names:
        from tram.model.gguf.rope import llama3_rope_parameters

        params.update(
            llama3_rope_parameters(
                names["rope_freqs.weight"],
                params["rope_theta"],
                int(field(reader, f"{arch}.rope.dimension_count", 0)),
                path,
            )
        )
    return params


def _yarn(reader: Any, arch: str, path: str) -> dict[str, Any]:
    """YaRN as llama.cpp computes it from the file: the correction range rounded out to whole
    dimensions (ggml_rope_yarn_corr_dims' floor and ceil: transformers' truncate), and the attention
    factor 0.1 * ln(factor) + 1 times the file's attn_factor where it has one."""
    original = field(reader, f"{arch}.rope.scaling.original_context_length")
    if not original:
        raise ValueError(f"{path}: YaRN RoPE scaling without {arch}.rope.scaling.original_context_length")
    factor = decimal(field(reader, f"{arch}.rope.scaling.factor"))
    params: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": int(original),
        "beta_fast": decimal(field(reader, f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
        "beta_slow": decimal(field(reader, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
        "truncate": True,
    }
    attn_factor = field(reader, f"{arch}.rope.scaling.attn_factor")
    if attn_factor:
        params["attention_factor"] = decimal(attn_factor) * (0.1 * math.log(factor) + 1.0)
    return params
