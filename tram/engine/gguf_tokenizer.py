"""The tokenizer a GGUF file's own vocabulary describes (`tram serve model.gguf` with no --tokenizer).

transformers converts GGUF vocabularies (sentencepiece, BPE) into fast tokenizers, but its GGUF
metadata reader imports torch, which the API server process does without (server/http/torch_free.py).
So the metadata is read here with the gguf package (numpy only) and handed to transformers'
converter, grouped as its own reader would group it.
"""

from __future__ import annotations

from typing import Any


def _tokenizer_fields(path: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(architecture, tokenizer dict, tokenizer config) as transformers' get_gguf_tokenizer builds them."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    from tram.model.gguf.file import open_gguf
    from tram.model.gguf.reader import GGUFFile

    open_gguf(path)  # the file's checks and their errors
    reader = GGUFFile(path, keep_strings=("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    metadata = {key: value for key, value in reader.fields.items() if key.startswith("tokenizer.")}
    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if "tokens" not in tokenizer:
        raise ValueError(f"{path} carries no vocabulary (tokenizer.ggml.tokens): pass --tokenizer")
    if tokenizer.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece vocabularies
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return reader.fields["general.architecture"], tokenizer, config


def load_gguf_tokenizer(path: str) -> Any:
    """A fast tokenizer (transformers' generic class) with the file's special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = _tokenizer_fields(path)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
