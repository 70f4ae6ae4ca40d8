"""Closing a JSON text before its request runs out of tokens.

A grammar keeps every token valid but cannot make a value end: a small model writing a JSON object
with no schema writes story text into its strings until max_tokens, and the client gets JSON cut
off mid-string (issue 36: 0 of 100 samples of stories260K ended). No grammar engine offers the
shortest way to finish a text, but for JSON it follows from the text alone: close the open string,
complete a half-written number or literal, give a key its value, close each open container. In the
last steps before the budget ends, a request's bitmask row keeps only the tokens that begin such a
closing (and that its grammar allows), so the text ends valid, with the grammar's own end: `stop`.

`closings` gives the texts that close a JSON prefix (one per separator style, `:` and `: `);
`ClosingMasks` turns them into bitmask rows over the vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_LITERALS = ("true", "false", "null")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_WHITESPACE = frozenset(" \t\n\r")


class _Lexer:
    """The state of a JSON prefix: its open containers and what each expects next, and a string,
    number or literal left half-written."""

    def __init__(self) -> None:
        self.frames: list[list[str]] = []  # [bracket, expects]: "{" with key?/key/colon/value/comma?, "[" ...
        self.started = self.done = self.broken = False
        self.in_string = self.is_key = self.escape = False
        self.unicode_left = 0
        self.scalar = ""

    def feed(self, text: str) -> None:
        for ch in text:
            if self.broken:
                return
            if self.in_string:
                self._string_char(ch)
            elif self.scalar and (ch in _NUMBER_CHARS or ch.isalpha()):
                self.scalar += ch
            else:
                if self.scalar:
                    self.scalar = ""
                    self.value_done()
                self._structural(ch)

    def _string_char(self, ch: str) -> None:
        if self.unicode_left:
            self.unicode_left -= 1
        elif self.escape:
            self.escape = False
            self.unicode_left = 4 if ch == "u" else 0
        elif ch == "\\":
            self.escape = True
        elif ch == '"':
            self.in_string = False
            if self.is_key:
                self.frames[-1][1] = "colon"
            else:
                self.value_done()

    def _structural(self, ch: str) -> None:
        if ch in _WHITESPACE:
            return
        top = self.frames[-1] if self.frames else None
        if self.done and ch:
            self.broken = True
        elif ch in "{[" and self._expects_value(top):
            self.started = True
            self.frames.append([ch, "key?" if ch == "{" else "value?"])
        elif ch == '"' and (self._expects_value(top) or (top is not None and top[1] in ("key?", "key"))):
            self.started = self.in_string = True
            self.is_key = top is not None and top[0] == "{" and top[1] in ("key?", "key")
        elif ch == ":" and top is not None and top[1] == "colon":
            top[1] = "value"
        elif ch == "," and top is not None and top[1] == "comma?":
            top[1] = "key" if top[0] == "{" else "value"
        elif ch in "}]" and top is not None and (top[0], ch) in (("{", "}"), ("[", "]")):
            self.frames.pop()
            self.value_done()
        elif (ch in _NUMBER_CHARS or ch.isalpha()) and self._expects_value(top):
            self.started = True
            self.scalar = ch
        else:
            self.broken = True

    def _expects_value(self, top: list[str] | None) -> bool:
        if top is None:
            return not self.started
        return top[1] in ("value", "value?")

    def value_done(self) -> None:
        if self.frames:
            self.frames[-1][1] = "comma?"
        else:
            self.done = True


def _finish_scalar(scalar: str) -> str:
    for literal in _LITERALS:
        if literal.startswith(scalar):
            return literal[len(scalar) :]
    return "0" if scalar[-1] in "+-.eE" else ""


# What each open container still needs, before its bracket, for each thing it may expect next.
_COLON = "\x00"  # stands for the key separator: ":" or ": "
_VALUE = "\x01"  # stands for a value: the shortest of each kind, as a small vocabulary may lack "0"
_VALUES = ("0", '""', "null", "true", "false", "{}", "[]")
_OBJECT_NEEDS = {"key?": "", "key": '""' + _COLON + _VALUE, "colon": _COLON + _VALUE, "value": _VALUE, "comma?": ""}
_ARRAY_NEEDS = {"value?": "", "value": _VALUE, "comma?": ""}


def closings(text: str) -> list[str]:
    """The shortest texts that make `text` one complete JSON value, for `:` and for `: ` after keys
    ([] when it is complete already or not JSON this reader follows)."""
    lexer = _Lexer()
    lexer.feed(text)
    if lexer.broken or lexer.done:
        return []
    if not lexer.started:
        return ["{}"]
    head = ""
    if lexer.in_string:
        head = ("n" if lexer.escape else "") + "0" * lexer.unicode_left + '"'
        if lexer.is_key:
            head += _COLON + _VALUE
        lexer.value_done()
    elif lexer.scalar:
        head = _finish_scalar(lexer.scalar)
        lexer.value_done()
    # The innermost container may still need a key or value; each outer one holds the container
    # inside it as its value, so it needs only its bracket.
    tail = "".join(
        (_OBJECT_NEEDS if bracket == "{" else _ARRAY_NEEDS)[expects if depth == 0 else "comma?"]
        + ("}" if bracket == "{" else "]")
        for depth, (bracket, expects) in enumerate(reversed(lexer.frames))
    )
    found = {(head + tail).replace(_COLON, colon).replace(_VALUE, value) for colon in (":", ": ") for value in _VALUES}
    if not lexer.in_string and text.endswith((":", ",")):  # a grammar may want its separator's space
        found |= {" " + closing for closing in found}
    return sorted(found)


# Every character a closing can hold: quotes, brackets, the colon and its space, the stand-in values,
# and the letters that finish a literal or an escape.
_CLOSING_CHARS = frozenset('"}]: 0{[') | frozenset("".join(_LITERALS)) | frozenset("n")


# How a space is spelt inside byte-level BPE and SentencePiece vocabularies.
_SPACE_MARKS = frozenset("\u0120\u2581")


class ClosingMasks:
    """Bitmask rows (one bit per token, in 32-bit words) of the tokens whose text begins a closing."""

    def __init__(self, tokenizer: Any, vocab_size: int, words: int) -> None:
        self.tokenizer, self.vocab_size, self.words = tokenizer, vocab_size, words
        self._candidates: list[tuple[int, str]] | None = None  # built on first use: most servers never need it

    def _find_candidates(self) -> list[tuple[int, str]]:
        """The tokens made only of closing characters: picked by their vocabulary spelling (one call
        for the whole vocabulary), then decoded one by one (a few hundred, not 150,000). Decoded
        alone, a token loses a leading space; the grammar still decides what it may follow."""
        known = min(self.vocab_size, len(self.tokenizer))
        pieces = self.tokenizer.convert_ids_to_tokens(list(range(known)))
        allowed = _CLOSING_CHARS | _SPACE_MARKS
        found = []
        for token, piece in enumerate(pieces):
            # SentencePiece spells a character it has no piece for as its byte: "<0x7D>" is "}".
            if piece and (set(piece) <= allowed or (piece.startswith("<0x") and piece.endswith(">"))):
                text = self.tokenizer.decode([token])
                if text and set(text) <= _CLOSING_CHARS:
                    found.append((token, text))
        return found

    def row(self, targets: list[str]) -> np.ndarray:
        if self._candidates is None:
            self._candidates = self._find_candidates()
        bits = np.zeros(self.words * 32, dtype=bool)
        for token, text in self._candidates:
            if any(target.startswith(text) for target in targets):
                bits[token] = True
        return np.packbits(bits, bitorder="little").view(np.int32)


def narrow_to_closing(row: np.ndarray, text: str, tokens_left: int, masks: ClosingMasks, closing: bool) -> bool:
    """Keep in `row` (the grammar's) only the tokens that begin a closing of `text`, once no more
    tokens are left than the longest closing and the end token need (or already `closing`: a
    request that began to close goes on closing, though a token that opened a value made its
    closings shorter). Unchanged if the grammar allows none of them (a schema whose required keys
    a closing cannot give) or the text is complete or not JSON. Returns whether it is closing."""
    targets = closings(text)
    # Room for the longest closing, one character a token, then the end token, and one spare: a
    # step whose grammar allows no closing token (a space it wants) still leaves time to close.
    if not targets or (not closing and tokens_left > max(len(t) for t in targets) + 2):
        return False
    narrowed = row & masks.row(targets)
    if narrowed.any():
        row[:] = narrowed
    return True
