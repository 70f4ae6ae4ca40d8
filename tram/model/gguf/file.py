"""A GGUF file (llama.cpp's format) read as a model: its metadata as a transformers config, its
tensors under the Hugging Face names Tram's models use.

Torch-free: the API server process builds the config of `tram serve model.gguf` before the engine
core starts. reader.py parses the file (a memory map; nothing is read until used).

What a GGUF file holds differently from a Hugging Face folder:
  * tensor names (`blk.3.attn_q.weight`) and reversed shapes (ggml's ne order: [K, N]);
  * Llama-family q/k rows permuted for llama.cpp's interleaved RoPE (convert_hf_to_gguf.py's
    `permute`); Qwen keeps Hugging Face's rotate-half order (NEOX RoPE), so only `llama` files are
    un-permuted (`unpermute_rows`);
  * no `output.weight` when the LM head is tied to the token embedding.
"""

from __future__ import annotations

import logging
import os
import re
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
# general.architecture -> (transformers architecture, config class name)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig"),  # Mistral files are written as llama too
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_TOP = re.compile(r"(\w+)\.(weight|bias)$")
# Tensors that carry no weight of the model (llama 3's RoPE factors are read into the config).
IGNORED_TENSORS = ("rope_freqs.weight",)


def is_gguf(model: str) -> bool:
    return model.endswith(GGUF_SUFFIX) and os.path.isfile(model)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor (None: not one Tram knows)."""
    m = _LAYER.match(gguf_name)
    if m:
        part = _LAYER_NAMES.get(m.group(2))
        return None if part is None else f"model.layers.{m.group(1)}.{part}.{m.group(3)}"
    m = _TOP.match(gguf_name)
    if m and m.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    return None


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
    """A transformers config equivalent to the GGUF metadata (what transformers' own GGUF loader
    would build), with `architectures` set so that Tram's registry finds the model class."""
    import transformers

    reader = open_gguf(path)
    arch = gguf_architecture(reader, path)
    architecture, config_class = ARCHITECTURES[arch]
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ValueError(f"{path} has no token_embd.weight tensor: not a complete model")
    hidden = int(field(reader, f"{arch}.embedding_length"))
    heads = int(field(reader, f"{arch}.attention.head_count"))
    kwargs: dict[str, Any] = dict(
        architectures=[architecture],
        vocab_size=int(names["token_embd.weight"].shape[1]),  # ggml order: [hidden, vocab]
        hidden_size=hidden,
        intermediate_size=int(field(reader, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(field(reader, f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        head_dim=int(field(reader, f"{arch}.attention.key_length", hidden // heads)),
        torch_dtype="float32",  # ggml computes in float32; the dequantized weights are float32 values
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id"),
    )
    kwargs["rope_parameters"] = _rope_parameters(reader, arch, names, path)
    # Biases: Qwen2's q/k/v always have them (its class says so); an o_proj bias means attention_bias.
    kwargs["attention_bias"] = "blk.0.attn_output.bias" in names
    config = getattr(transformers, config_class)(**kwargs)
    return config


def _rope_parameters(reader: Any, arch: str, names: dict[str, Any], path: str) -> dict[str, Any]:
    """transformers' rope_parameters: the base frequency, and linear scaling when the file has it."""
    params: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        params.update(rope_type="linear", factor=float(field(reader, f"{arch}.rope.scaling.factor")))
    elif kind not in ("none", None):
        raise ValueError(f"{path}: RoPE scaling {kind!r} in GGUF files is not supported yet (linear is)")
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


def unpermute_rows(rows: Any, num_heads: int) -> Any:
    """Undo convert_hf_to_gguf.py's q/k permutation of a llama tensor's rows (numpy array [N, ...]):
    per head, rows (pair i, half j) go back from interleaved order to Hugging Face's rotate-half."""
    n = rows.shape[0]
    return rows.reshape(num_heads, n // num_heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
