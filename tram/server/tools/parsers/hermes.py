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
from tram.server.tools.parsers.calls_stream import CallsStream

START_TAG, END_TAG = "<tool_call>", "</tool_call>"
_TEXT, _TAIL = "text", "tail"  # outside calls: in text, or just after a call's object


def partial_tag_start(text: str, tag: str) -> int:
    """Where the longest suffix of `text` that could begin `tag` starts; len(text) if none."""
    for k in range(max(0, len(text) - len(tag) + 1), len(text)):
        if tag.startswith(text[k:]):
            return k
    return len(text)


@TOOL_CALL_PARSERS.register("hermes", "Qwen, Hermes")
class HermesToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return _HermesStream()


class _HermesStream(CallsStream):
    def __init__(self) -> None:
        super().__init__(("arguments",))
        self._state = _TEXT
        self._held = ""  # what could begin a tag (and, after a call, the whitespace before it)
        self._blank = ""  # the text since the last call, while it is only whitespace
        self._has_text = False  # the text since the last call is content

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        return self._tail(text) if self._state == _TAIL else self._text(text)

    def _text(self, text: str) -> str:
        k = text.find(START_TAG)
        if k < 0:
            j = partial_tag_start(text, START_TAG)
            self._segment(text[:j])
            self._held = text[j:]
            return ""
        self._segment(text[:k])
        self._begin_call(self._blank + START_TAG)
        self._blank, self._has_text = "", False
        return text[k + len(START_TAG) :]

    def _segment(self, text: str) -> None:
        """Text between calls: content once it has more than whitespace, whitespace included."""
        if self._has_text:
            self._out.content(text)
        elif text.strip():
            self._out.content(self._blank + text)
            self._blank, self._has_text = "", True
        else:
            self._blank += text

    def _tail(self, text: str) -> str:
        rest = text.lstrip()
        if rest.startswith(END_TAG):
            self._state = _TEXT
            return rest[len(END_TAG) :]
        if END_TAG.startswith(rest):
            self._held = text
            return ""
        self._state = _TEXT  # no closing tag: the text goes on
        return text

    def _after_call(self) -> None:
        self._state = _TAIL

    def _finish_outside(self) -> None:
        if self._state == _TEXT:
            self._segment(self._held)  # it began like a tag but the output ended
        # After a call, whitespace and the start of a closing tag are dropped like a whole one.
