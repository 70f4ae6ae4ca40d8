"""Streaming the output of a forced tool choice, which a JSON-schema grammar made valid (forced.py
builds the schema): for a named function, its arguments object; for "required", an array of
`{"name": ..., "parameters": {...}}` items, or one such item alone (parallel_tool_calls false).
Only tool-call deltas are sent, never content.

The stream never raises: an output cut short (max_tokens) ends where it was cut, and text that
breaks the expected shape is dropped. Either way `malformed` is set, which is what makes
`parse_forced_tool_calls` refuse the output.
"""

from __future__ import annotations

from typing import Any

from tram.server.tools.parsers.base import DeltaMessage, ToolCallStream, new_tool_call_id
from tram.server.tools.parsers.call_reader import loads_strict
from tram.server.tools.parsers.calls_stream import CallsStream
from tram.server.tools.parsers.deltas import DeltaBuilder
from tram.server.tools.parsers.json_scan import JSON_WHITESPACE


def forced_function_name(tool_choice: str | dict[str, Any]) -> str | None:
    """The function a named tool_choice forces; None for "required"; ValueError otherwise."""
    if tool_choice == "required":
        return None
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or tool_choice.get("type", "function") != "function":
        raise ValueError(f"tool_choice {tool_choice!r} forces no tool call")
    return name


class ForcedToolStream(ToolCallStream):
    def __init__(self, tool_choice: str | dict[str, Any]) -> None:
        name = forced_function_name(tool_choice)
        self._inner = _RequiredStream() if name is None else _NamedStream(name)

    @property
    def malformed(self) -> bool:  # type: ignore[override]
        return self._inner.malformed

    def feed(self, delta_text: str) -> DeltaMessage | None:
        return self._inner.feed(delta_text)

    def finish(self) -> DeltaMessage | None:
        return self._inner.finish()


class _NamedStream(ToolCallStream):
    """The whole output is the arguments: sent as it comes, less surrounding whitespace."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._id: str | None = new_tool_call_id()  # None once sent
        self._blank = ""  # trailing whitespace, sent only if more text follows it
        self._sent: list[str] = []

    def feed(self, delta_text: str) -> DeltaMessage | None:
        out = DeltaBuilder()
        if self._id is not None:
            out.call(0, call_id=self._id, name=self._name)
            self._id = None
        text = self._blank + delta_text
        if not self._sent:
            text = text.lstrip()
        kept = text.rstrip()
        self._blank = text[len(kept) :]
        if kept:
            self._sent.append(kept)
            out.call(0, arguments=kept)
        return out.take()

    def finish(self) -> DeltaMessage | None:
        message = self.feed("") if self._id is not None else None
        try:
            self.malformed = not isinstance(loads_strict("".join(self._sent)), dict)
        except ValueError:
            self.malformed = True
        return message


class _RequiredStream(CallsStream):
    """`[` item (`,` item)* `]`, or one item alone; each item a call object with its arguments in
    "parameters"."""

    _OPEN, _ITEM, _AFTER_ITEM, _CLOSED = range(4)

    def __init__(self) -> None:
        super().__init__(("parameters",))
        self._state = self._OPEN
        self._alone = False  # the output is one call object, not an array

    def _outside(self, piece: str) -> str:
        for i, c in enumerate(piece):
            if c in JSON_WHITESPACE:
                continue
            if self._state in (self._OPEN, self._ITEM) and c == "{":
                self._alone = self._state == self._OPEN
                self._begin_call("")
                return piece[i:]
            if (self._state, c) in ((self._OPEN, "["), (self._AFTER_ITEM, ",")):
                self._state = self._ITEM
            elif self._state == self._AFTER_ITEM and c == "]":
                self._state = self._CLOSED
            else:
                return self._fail("")
        return ""

    def _after_call(self) -> None:
        self._state = self._CLOSED if self._alone else self._AFTER_ITEM

    def _finish_outside(self) -> None:
        self.malformed = self._state != self._CLOSED

    def _spill(self, text: str) -> None:
        pass  # a forced output has no content
