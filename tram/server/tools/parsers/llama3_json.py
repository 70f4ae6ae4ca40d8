"""Llama 3.1/3.2 JSON tool calls: the whole output is one or more call objects, separated by `;`,
optionally after `<|python_tag|>`:

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

An output whose first character (after whitespace and the tag) is not `{` is plain content, all of
it. Once calls begin, only whitespace and one `;` may stand between them; anything else makes the
rest malformed (base.py). The arguments member is "parameters", or "arguments" as some fine-tunes
write it. Until the first non-whitespace character after the tag, everything is held back.
"""

from __future__ import annotations

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.calls_stream import CallsStream

PYTHON_TAG = "<|python_tag|>"
_START, _PLAIN, _BETWEEN = "start", "plain", "between"


@TOOL_CALL_PARSERS.register("llama3_json", "Llama 3.1+")
class Llama3JsonToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return _Llama3JsonStream()


class _Llama3JsonStream(CallsStream):
    def __init__(self) -> None:
        super().__init__(("parameters", "arguments"))
        self._state = _START
        self._held = ""  # the start of the output, or what followed the last call, until it tells

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        if self._state == _PLAIN:
            self._out.content(text)
            return ""
        body = self._skip_lead_in(text)
        if body is None or body == "":
            self._held = text  # it could still be a lead-in to a call
            return ""
        if body[0] == "{":
            start = len(text) - len(body)
            self._begin_call(text[:start])
            return text[start:]
        if self._state == _START:
            self._state = _PLAIN
            self._out.content(text)
            return ""
        self._pending = text  # text after a call that is not another call
        return self._fail("")

    def _skip_lead_in(self, text: str) -> str | None:
        """What follows the whitespace and `<|python_tag|>` (at the start) or `;` (after a call)
        that may precede a call; None while the text could still be the beginning of the tag."""
        body = text.lstrip()
        if self._state == _START:
            if body.startswith(PYTHON_TAG):
                return body[len(PYTHON_TAG) :].lstrip()
            return None if PYTHON_TAG.startswith(body) else body
        return body[1:].lstrip() if body.startswith(";") else body

    def _after_call(self) -> None:
        self._state = _BETWEEN

    def _finish_outside(self) -> None:
        if self._state == _START:
            self._out.content(self._held)  # whitespace, or the beginning of the tag: plain text
        # After a call, trailing whitespace and a last `;` are dropped.
