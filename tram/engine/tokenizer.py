"""Loading a tokenizer and the two prompt-side jobs that need it: stop token ids and chat templates.

Tram only works with "fast" tokenizers (a Rust `tokenizers.Tokenizer` behind the transformers object),
because the incremental detokenizer streams through that backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase


def load_tokenizer(
    path_or_id: str, revision: str | None = None, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Load the fast tokenizer of a model directory or hub id, or the one a GGUF file's vocabulary
    describes (transformers converts it); ValueError if that is not possible."""
    try:
        if path_or_id.endswith(".gguf") and os.path.isfile(path_or_id):
            from tram.engine.gguf_tokenizer import load_gguf_tokenizer

            tokenizer = load_gguf_tokenizer(path_or_id)
        else:
            tokenizer = AutoTokenizer.from_pretrained(
                path_or_id, revision=revision, trust_remote_code=trust_remote_code, use_fast=True
            )
    except Exception as e:  # noqa: BLE001 - loaders raise many types; the user needs one clear message
        raise ValueError(
            f"could not load a tokenizer from {path_or_id!r}{f' (revision {revision!r})' if revision else ''}: {e}"
        ) from e
    # The detokenizer streams through the Rust backend, so a slow (pure Python) tokenizer is no use.
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"the tokenizer of {path_or_id!r} has no fast (tokenizers) backend; "
            "Tram needs a model that ships tokenizer.json"
        )
    return tokenizer


# How many more tokens than embedding rows a tokenizer may have before it is taken for another
# model's: a few added tokens beyond the rows occur in real checkpoints (never emitted by the model,
# and prompts holding them are refused per request); a tokenizer 1% larger is a different vocabulary.
_TOKENIZER_EXCESS = 0.01


def check_tokenizer_fits(tokenizer: PreTrainedTokenizerBase, vocab_size: int, source: str) -> None:
    """ValueError at start for a tokenizer that is plainly not the model's (one of another model,
    e.g. beside a GGUF file): its ids would run past the embedding, so every prompt would fail.
    Fewer tokens than rows is normal (vocabularies are padded)."""
    if len(tokenizer) > vocab_size * (1 + _TOKENIZER_EXCESS):
        raise ValueError(
            f"the tokenizer {source!r} has {len(tokenizer)} tokens but the model's vocabulary has "
            f"{vocab_size} rows: it is not this model's tokenizer (pass --tokenizer)"
        )


def _as_id_list(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _generation_config_eos(model_path: str) -> list[int]:
    try:
        gen_config = GenerationConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        # Many models ship no generation_config.json; the model config and tokenizer still name an eos.
        return []
    return _as_id_list(gen_config.eos_token_id)


def _hf_config_eos(hf_config: Any) -> list[int]:
    eos = getattr(hf_config, "eos_token_id", None)
    # Multimodal configs keep the language model's ids on the text sub-config.
    if eos is None and hasattr(hf_config, "get_text_config"):
        eos = getattr(hf_config.get_text_config(), "eos_token_id", None)
    return _as_id_list(eos)


def get_stop_token_ids(model_path: str, tokenizer: PreTrainedTokenizerBase, hf_config: Any) -> list[int]:
    """Every token id that ends generation, deduplicated, in order of authority.

    generation_config.json comes first because that is what the model authors run generation with
    (it often lists more than one id, e.g. stories260K stops on </s> and on <s>), then the model
    config, then the tokenizer's eos token.
    """
    candidates = (
        _generation_config_eos(model_path)
        + _hf_config_eos(hf_config)
        + _as_id_list(getattr(tokenizer, "eos_token_id", None))
    )
    return list(dict.fromkeys(candidates))


class MissingChatTemplateError(ValueError):
    """Chat was asked of a model with no chat template, and the request named none (vLLM answers 400)."""


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    *,
    add_special_tokens: bool = False,
    check_text: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> list[int]:
    """Render `messages` with the chat template and return the prompt token ids.

    `chat_template` overrides the tokenizer's own template; extra kwargs (tools, documents,
    enable_thinking, ...) are handed to the template. `add_special_tokens` mirrors the OpenAI-server
    flag of the same name: off by default because templates write their own BOS. `check_text`
    sees the rendered text before it is tokenized (to refuse one too long to fit at once).
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise MissingChatTemplateError(
            "this model has no chat template (a base model, or a file without one) and none was given: "
            "pass one (--chat-template, or chat_template in the request) or send a plain text prompt"
        )
    # Render to text first and tokenize ourselves: the return type of tokenize=True changed across
    # transformers versions (list, BatchEncoding, dict), and we must control add_special_tokens.
    text = tokenizer.apply_chat_template(
        messages,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
    if not isinstance(text, str):
        raise ValueError(f"chat template rendered a {type(text).__name__}, expected a string")
    if check_text is not None:
        check_text(text)
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=add_special_tokens)]
    return _drop_doubled_bos(ids, tokenizer.bos_token_id)


def _drop_doubled_bos(ids: list[int], bos_token_id: int | None) -> list[int]:
    # When the template writes BOS and the caller also asked for special tokens, the tokenizer adds
    # another one; a doubled BOS measurably hurts some models, so keep one.
    if bos_token_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_token_id:
        return ids[1:]
    return ids
