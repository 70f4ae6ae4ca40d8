"""Reads one tool-call object, `{"name": "...", "arguments": {...}}`, piece by piece.

It follows the object's members just far enough to know, as early as the text allows, the decoded
name (once its string closes) and how much of the arguments value has arrived, so that a stream can
send both before the object is complete. Keys other than the name and arguments are skipped. Only
`result()` decides whether the call is well formed: it parses the whole object with `json.loads`.
"""

from __future__ import annotations

import json

from tram.server.tools.parsers.json_scan import JSON_WHITESPACE, ValueScanner

# Where the reader is in the object, between values.
_OPEN, _FIRST_KEY, _KEY, _IN_KEY, _COLON, _VALUE, _IN_VALUE, _AFTER_VALUE = range(8)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN and Infinity; clients do not


def loads_strict(text: str) -> object:
    """json.loads refusing NaN/Infinity; ValueError for anything that is not JSON."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as e:  # nested deeper than json's recursion allows
        raise ValueError("JSON nested too deeply") from e


class CallReader:
    """Fed the text of one call object, from anywhere before its `{` (whitespace is skipped),
    until `done` (its closing `}` was read) or `error` (the text cannot be such an object)."""

    def __init__(self, arg_keys: tuple[str, ...]) -> None:
        self.text = ""  # what was consumed, up to the closing brace once done
        self.name: str | None = None  # set once the name's string is complete
        self.done = False
        self.error = False
        self._arg_keys = arg_keys
        self._state = _OPEN
        self._pos = 0  # next character of self.text to read
        self._scanner: ValueScanner | None = None
        self._start = 0  # where the key or value being scanned starts
        self._key = ""
        self._args_start: int | None = None
        self._args_end = 0  # how far the arguments value has been read
        self._args_sent = 0

    @property
    def has_arguments(self) -> bool:
        return self._args_start is not None

    def feed(self, piece: str) -> int:
        """Read on into `piece`; return how many of its characters belong to the object (all of
        them unless it ended or went wrong inside this piece)."""
        before = len(self.text)
        self.text += piece
        while self._pos < len(self.text) and not (self.done or self.error):
            if self._scanner is not None:
                self._scan()
            else:
                self._punctuation(self.text[self._pos])
        self.text = self.text[: self._pos]
        return self._pos - before

    def take_arguments(self) -> str:
        """The arguments text read since the last call (never past the arguments value)."""
        if self._args_start is None:
            return ""
        fragment = self.text[self._args_sent : self._args_end]
        self._args_sent = self._args_end
        return fragment

    def result(self) -> tuple[str, str] | None:
        """(name, arguments) of a complete, well-formed call; None otherwise. No arguments member
        means no arguments: "{}"."""
        if not self.done or self.name is None:
            return None
        try:
            loads_strict(self.text)
        except ValueError:
            return None
        if self._args_start is None:
            return self.name, "{}"
        return self.name, self.text[self._args_start : self._args_end]

    def _punctuation(self, c: str) -> None:
        """One character between keys and values: whitespace, a brace, quote, colon or comma."""
        state = self._state
        if c in JSON_WHITESPACE:
            self._pos += 1
        elif state == _VALUE:
            self._begin_value(c)
        elif (state == _OPEN and c == "{") or (state == _COLON and c == ":"):
            self._state = _FIRST_KEY if state == _OPEN else _VALUE
            self._pos += 1
        elif state in (_FIRST_KEY, _KEY) and c == '"':
            self._state, self._start, self._scanner = _IN_KEY, self._pos, ValueScanner()
        elif state == _AFTER_VALUE and c == ",":
            self._state, self._pos = _KEY, self._pos + 1
        elif state in (_FIRST_KEY, _AFTER_VALUE) and c == "}":
            self.done, self._pos = True, self._pos + 1
        else:
            self.error = True

    def _begin_value(self, first: str) -> None:
        key = self._key
        if key == "name" and (first != '"' or self.name is not None):
            self.error = True  # a name that is not a string, or a second name
            return
        if key in self._arg_keys:
            if first != "{" or self._args_start is not None:
                self.error = True  # arguments that are not an object, or a second arguments member
                return
            self._args_start = self._args_end = self._args_sent = self._pos
        self._state, self._start, self._scanner = _IN_VALUE, self._pos, ValueScanner()

    def _scan(self) -> None:
        assert self._scanner is not None
        end = self._scanner.scan(self.text, self._pos)
        self._pos = len(self.text) if end is None else end
        if self._state == _IN_VALUE and self._key in self._arg_keys:
            self._args_end = self._pos
        if end is None:
            return
        self._scanner = None
        if self._state == _IN_KEY:
            self._end_key(self.text[self._start : end])
        else:
            self._end_value(self.text[self._start : end])

    def _end_key(self, key_text: str) -> None:
        try:
            self._key, self._state = str(loads_strict(key_text)), _COLON
        except ValueError:
            self.error = True  # a bad escape

    def _end_value(self, value_text: str) -> None:
        self._state = _AFTER_VALUE
        if self._key != "name":
            return  # any other value is checked with the whole object
        try:
            self.name = str(loads_strict(value_text))
        except ValueError:
            self.error = True  # a bad escape
            return
        self.error = not self.name  # an empty name names no tool
