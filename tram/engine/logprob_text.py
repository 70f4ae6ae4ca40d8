"""The text and bytes of a token in logprobs, chosen so that the tokens add up to the text.

The rule (for `Logprob.decoded_token`, and through it completions `tokens` and chat `token`):

* A sampled or prompt token's text is what it added to the text, in context, as the incremental
  detokenizer rendered it. A SentencePiece '▁' piece keeps its space (unless the decoder strips it
  at the very start of the text), so `"".join(texts) == text`.
* Bytes of an incomplete UTF-8 character (byte fallback `<0xE2>`, a byte-level piece) add "", and
  the token that completes the character adds all of it; bytes that never complete add "".
* A token the text does not show adds "": a special token under skip_special_tokens, and the stop
  token (eos or stop_token_ids) that ended the request unless include_stop_str_in_output is set.
* A stop string truncates the text but not the token texts: the tokens that hold the stop string
  keep their whole text, so the text is then a prefix of the joined tokens.
* An alternative (top-k) token's text is what it would add after a word: with its leading space,
  an added or special token as its content, without the U+FFFD of bytes that end or start inside
  a character. Where bytes are pending, a byte token that would complete them shows the character.
* A token's bytes (chat `bytes`) are the UTF-8 of its text, except that a token holding raw bytes
  not valid on their own (`<0xE2>`) gives those bytes: the bytes of the tokens then add up to the
  UTF-8 of the text even where `token` is "" (a partial character) or a whole character.

Per-token results are memoized per tokenizer, so a top-k row costs k dict lookups once the
tokens have been seen; nothing is re-decoded per step.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

_REPLACEMENT = "\ufffd"
# What an alternative follows: a plain word, so that a leading '▁' or WordPiece space shows.
_CONTEXT_PIECE = "a"
_BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTextTable:
    """Per-tokenizer text and bytes of single tokens, memoized (build it with `token_text_table`)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._decoder = self._backend.decoder
        self._added = {i: t.content for i, t in self._backend.get_added_tokens_decoder().items()}
        self._context_text = self._decoder.decode([_CONTEXT_PIECE]) if self._decoder is not None else ""
        decoder_repr = repr(self._decoder)
        self._byte_fallback = "ByteFallback(" in decoder_repr
        self._byte_level = _byte_level_alphabet() if "ByteLevel(" in decoder_repr else None
        self._alternatives: dict[int, str] = {}
        self._raw: dict[int, bytes | None] = {}

    def alternative(self, token_id: int) -> str:
        """What the token would add after a word (see the module's rule)."""
        text = self._alternatives.get(token_id)
        if text is None:
            text = self._alternatives[token_id] = self._standalone(token_id)
        return text

    def alternative_after(self, held: list[int], token_id: int) -> str:
        """What the token would add where `held` ids (an incomplete character) are pending. Only a
        byte token can complete them; any other token, or bytes that do not, show as alone."""
        if self.raw_bytes(token_id) is None:
            return self.alternative(token_id)
        text = self._backend.decode([*held, token_id], skip_special_tokens=True)
        return text if text and _REPLACEMENT not in text else self.alternative(token_id)

    def raw_bytes(self, token_id: int) -> bytes | None:
        """The bytes of a byte token that is not valid UTF-8 on its own, else None."""
        if token_id in self._raw:
            return self._raw[token_id]
        raw = None
        piece = self._backend.id_to_token(token_id)
        if piece is not None and token_id not in self._added:
            raw = self._piece_bytes(piece)
            if raw is not None and _valid_utf8(raw):
                raw = None  # its text says the same, with the context's spaces right
        self._raw[token_id] = raw
        return raw

    def token_bytes(self, token_id: int, text: str) -> list[int]:
        """Chat's `bytes` for a token whose text (in context) is `text`."""
        raw = self.raw_bytes(token_id)
        return list(raw if raw is not None else text.encode("utf-8"))

    def _standalone(self, token_id: int) -> str:
        content = self._added.get(token_id)
        if content is not None:
            return content
        piece = self._backend.id_to_token(token_id)
        if piece is None:  # an id past the tokenizer's vocabulary (padded embedding rows)
            return ""
        text = None
        if self._decoder is not None:
            in_context = self._decoder.decode([_CONTEXT_PIECE, piece])
            if in_context.startswith(self._context_text):
                text = in_context[len(self._context_text) :]
        if text is None:  # no decoder, or one that rewrote the context: the token alone
            text = self._tokenizer.decode([token_id])
        return text.replace(_REPLACEMENT, "")

    def _piece_bytes(self, piece: str) -> bytes | None:
        if self._byte_fallback:
            match = _BYTE_FALLBACK_PIECE.fullmatch(piece)
            return bytes([int(match.group(1), 16)]) if match else None
        if self._byte_level is not None and all(c in self._byte_level for c in piece):
            return bytes(self._byte_level[c] for c in piece)
        return None


def _valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of GPT-2's byte-level BPE: printable Latin-1 bytes stand for themselves and
    the other 68 bytes, in order, for the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    alphabet = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if chr(b) not in alphabet]
    for n, b in enumerate(shifted):
        alphabet[chr(256 + n)] = b
    return alphabet


_tables: weakref.WeakKeyDictionary[Any, TokenTextTable] = weakref.WeakKeyDictionary()


def token_text_table(tokenizer: Any) -> TokenTextTable:
    """The tokenizer's table, built once; it dies with the tokenizer."""
    table = _tables.get(tokenizer)
    if table is None:
        table = _tables.setdefault(tokenizer, TokenTextTable(tokenizer))
    return table


def leading_token_text(text: str, rest: list[str], fallback: str) -> str:
    """The text of a sequence's first token, which has no logprob row: whatever of `text` the
    other tokens do not account for, so that all of them add up to `text` (the echoed prompt);
    `fallback` when `text` does not end with their text (a prompt the tokenizer normalised)."""
    tail = "".join(rest)
    return text[: len(text) - len(tail)] if text.endswith(tail) else fallback
