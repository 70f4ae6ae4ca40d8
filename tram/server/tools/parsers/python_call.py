"""One Python call, `get_weather(city="Paris", days=[1, 2])`, read piece by piece (pythonic.py).

Reading only tracks what decides where the call ends: strings (with their escapes and triple
quotes) and the depth of brackets outside them. Once the call's `)` closes it, `complete` parses
it with `ast` and turns the keyword arguments into a JSON object: literals only (strings, numbers,
booleans, None, lists, tuples, dicts with string keys), never evaluated. The id and name go out as
soon as `name(` is read; the arguments, which are made rather than sliced, once the call is whole.
It keeps CallEmitter's interface, so CallsStream runs it like a JSON call object.
"""

from __future__ import annotations

import ast
import json
import math

from tram.server.tools.parsers.base import new_tool_call_id
from tram.server.tools.parsers.deltas import DeltaBuilder

_OPEN, _CLOSE, _QUOTES = "([{", ")]}", "\"'"


def json_literal(node: ast.expr) -> object:
    """The JSON value a literal node stands for; ValueError if it is no literal or has no JSON
    equivalent (bytes, sets, complex numbers, NaN, a dict key that is not a string)."""
    value = ast.literal_eval(node)

    def check(v: object) -> object:
        if v is None or isinstance(v, (str, bool, int)):
            return v
        if isinstance(v, float) and math.isfinite(v):
            return v
        if isinstance(v, (list, tuple)):
            return [check(x) for x in v]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: check(x) for k, x in v.items()}
        raise ValueError(f"{type(v).__name__} has no JSON equivalent")

    return check(value)


def call_arguments(text: str) -> tuple[str, str] | None:
    """(name, JSON arguments) of `text` if it is exactly one call by keyword with literal values."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        names = [k.arg for k in node.keywords]
        if None in names or len(set(names)) < len(names):
            return None  # **kwargs, or an argument given twice
        arguments = {k.arg: json_literal(k.value) for k in node.keywords if k.arg is not None}
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    return node.func.id, json.dumps(arguments, ensure_ascii=False)


class PythonCall:
    """Fed the text of one call from its name's first character until `done` (the call's `)`)
    or `error` (no `name(` to begin it)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.reader = self  # CallsStream asks the reader whether the call is done or went wrong
        self.done = False
        self.error = False
        self.text = ""
        self._id = new_tool_call_id()
        self._name: str | None = None
        self._depth = 0
        self._quote = ""  # the open string's quote ('"', "'", '"""' or "'''"), "" outside strings
        self._escaped = False
        self._closing = 0  # quotes in a row that may close a triple-quoted string
        self._string_start = -1  # just past the open string's opening quote
        self._empty_string_end = -1  # where a "" or '' closed: a third quote makes it triple

    def feed(self, piece: str, out: DeltaBuilder) -> int:
        for i, c in enumerate(piece):
            self.text += c
            if self._quote:
                self._in_string(c)
            else:
                self._outside(c, out)
            if self.error:
                self.text = self.text[:-1]
                return i
            if self.done:
                return i + 1
        return len(piece)

    def _in_string(self, c: str) -> None:
        quote = self._quote
        if self._escaped:
            self._escaped = False
        elif c == "\\":
            self._escaped, self._closing = True, 0
        elif c == quote[0]:
            self._closing += 1
            if self._closing == len(quote):
                self._quote, self._closing = "", 0
                if len(self.text) - 1 == self._string_start:
                    self._empty_string_end = len(self.text)
        else:
            self._closing = 0

    def _outside(self, c: str, out: DeltaBuilder) -> None:
        if self._name is None:
            self._read_name(c, out)
        elif c in _QUOTES:
            if self._empty_string_end == len(self.text) - 1 and self.text.endswith(c * 3):
                self._quote = c * 3  # the "" was the start of """
            else:
                self._quote, self._string_start = c, len(self.text)
        elif c in _OPEN:
            self._depth += 1
        elif c in _CLOSE:
            self._depth -= 1
            self.done = self._depth == 0

    def _read_name(self, c: str, out: DeltaBuilder) -> None:
        if c == "(":
            name = self.text[:-1]
            if not name.isidentifier():
                self.error = True
                return
            self._name, self._depth = name, 1
            out.call(self.index, call_id=self._id, name=name)
        elif not (c.isalnum() or c == "_"):
            self.error = True

    def complete(self, out: DeltaBuilder) -> bool:
        """Once the call's `)` was read: whether it is a call we can send, and send its arguments."""
        parsed = call_arguments(self.text)
        if parsed is None:
            return False
        out.call(self.index, arguments=parsed[1])
        return True
