"""One call whose name the format gives before its arguments object (Mistral's
`[TOOL_CALLS]name[ARGS]{...}`, gpt-oss's `to=functions.name ... <|message|>{...}`), read piece by
piece. It keeps CallEmitter's interface, so CallsStream runs it like a `{"name", ...}` object: the
id and name go out at once, the arguments as they arrive, and only `complete` decides whether they
are a JSON object.
"""

from __future__ import annotations

from tram.server.tools.parsers.base import new_tool_call_id
from tram.server.tools.parsers.call_reader import loads_strict
from tram.server.tools.parsers.deltas import DeltaBuilder
from tram.server.tools.parsers.json_scan import JSON_WHITESPACE, ValueScanner


class ArgsCall:
    """Fed the text from anywhere before the arguments' `{` (whitespace is skipped) until `done`
    (the object closed) or `error` (the first character is not `{`)."""

    def __init__(self, index: int, name: str, call_id: str | None = None) -> None:
        self.index = index
        self.name = name
        self.reader = self  # CallsStream asks the reader whether the call is done or went wrong
        self.done = False
        self.error = False
        self._id = call_id or new_tool_call_id()
        self._named = False
        self._scanner: ValueScanner | None = None
        self._arguments = ""

    def feed(self, piece: str, out: DeltaBuilder) -> int:
        """Read on into `piece`, send what became known; how many characters the call used."""
        if not self._named:
            out.call(self.index, call_id=self._id, name=self.name)
            self._named = True
        pos = 0
        if self._scanner is None:
            while pos < len(piece) and piece[pos] in JSON_WHITESPACE:
                pos += 1
            if pos == len(piece):
                return pos
            if piece[pos] != "{":
                self.error = True
                return pos
            self._scanner = ValueScanner()
        end = self._scanner.scan(piece, pos)
        fragment = piece[pos:end]
        self._arguments += fragment
        out.call(self.index, arguments=fragment)
        self.done = end is not None
        return len(piece) if end is None else end

    def complete(self, out: DeltaBuilder) -> bool:
        """Once the object has closed: whether the arguments are a JSON object."""
        try:
            return isinstance(loads_strict(self._arguments), dict)
        except ValueError:
            return False
