"""Hermes-style tool calls (Qwen 2.5/3, Hermes, and many models trained on their format):

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text outside calls is content, piece by piece: a piece of it that is only whitespace (as between
two calls) is not, so an output that is calls and whitespace has no content (None). A closing tag
that never comes is forgiven once the object is complete (the output may stop at `</tool_call>`
as a stop string); what follows the object then is text. A suffix that could begin `<tool_call>`
is held back until the next text tells.
"""

from __future__ import annotations

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.calls_stream import Call, CallsStream
from tram.server.tools.parsers.text_run import TextRun, skip_end_tag

START_TAG, END_TAG = "<tool_call>", "</tool_call>"
_TEXT, _TAIL = "text", "tail"  # outside calls: in text, or just after a call's object


@TOOL_CALL_PARSERS.register("hermes", "Qwen, Hermes")
class HermesToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return HermesStream()


class HermesStream(CallsStream):
    """Also the stream of formats that differ only in what a call inside the tags is (qwen3_coder.py)."""

    def __init__(self) -> None:
        super().__init__(("arguments",))
        self._state = _TEXT
        self._run = TextRun(self._out, START_TAG)
        self._held = ""  # what could begin a tag (and, after a call, the whitespace before it)

    def _call_at_tag(self) -> Call | None:
        """The call that a start tag begins (None: a `{"name", ...}` object)."""
        return None

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        if self._state == _TAIL:
            rest = skip_end_tag(text, END_TAG)
            if rest is None:
                self._held = text
                return ""
            self._state, text = _TEXT, rest
        rest, held = self._run.read(text)
        if rest is None:
            self._held = held
            return ""
        self._begin_call(held + START_TAG, self._call_at_tag())
        return rest

    def _after_call(self) -> None:
        self._state = _TAIL
        self._run.after_call()

    def _finish_outside(self) -> None:
        if self._state == _TEXT:
            self._run.add(self._held)  # it began like a tag but the output ended
        # After a call, whitespace and the start of a closing tag are dropped like a whole one.
