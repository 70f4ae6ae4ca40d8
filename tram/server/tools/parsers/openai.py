"""gpt-oss tool calls, read from the text of its harmony messages (the markers are special tokens,
so the request must keep them: `skip_special_tokens: false`):

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

A message addressed `to=functions.NAME` is a call; its body is the arguments object (args_call.py).
The bodies of `final` messages and of `commentary` without a recipient (a preamble) are content;
`analysis` is reasoning, a reasoning parser's to report, and like headers and markers it is not
content. The first message's `<|start|>assistant` is in the prompt; the `<|call|>` or `<|return|>`
that ends the output may be missing (the engine stops on it). An output that does not begin with a
harmony marker is plain content, all of it. A call with a bad header, a recipient other than
`functions.`, arguments that are not a JSON object, or text outside messages, is malformed
(base.py); text already sent as content stays sent, so then the streamed content is what was sent
plus the raw text from after it, where the non-streamed content is the whole output.
"""

from __future__ import annotations

import re

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.args_call import ArgsCall
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.calls_stream import CallsStream
from tram.server.tools.parsers.text_run import partial_tag_start

START, CHANNEL, MESSAGE, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
_BODY_ENDS = ("<|end|>", "<|return|>", CALL)
_HEADER = re.compile(
    r"(?:<\|start\|>)?(?:assistant)?[ ]*(?:to=(?P<to1>[^\s<]+)[ ]*)?<\|channel\|>(?P<channel>\w+)"
    r"(?:[ ]*to=(?P<to2>[^\s<]+))?[ ]*(?:<\|constrain\|>)?[ ]*(?P<type>[\w/.+-]*)[ ]*"
)
_FUNCTION = re.compile(r"functions\.([A-Za-z0-9_.-]+)")
_START, _PLAIN, _HEAD, _CONTENT, _ANALYSIS, _AFTER_CALL, _BETWEEN = range(7)


def read_header(header: str) -> tuple[int, str]:
    """A message's header (before `<|message|>`): (_CONTENT, ""), (_ANALYSIS, ""), (_AFTER_CALL,
    the function's name) or (_PLAIN, "") when it is not one we can read."""
    m = _HEADER.fullmatch(header.strip())
    if m is None:
        return _PLAIN, ""
    recipient = m.group("to1") or m.group("to2")
    if recipient is None:
        return (_ANALYSIS, "") if m.group("channel") == "analysis" else (_CONTENT, "")
    function = _FUNCTION.fullmatch(recipient)
    if function is None or (m.group("type") and "json" not in m.group("type")):
        return _PLAIN, ""
    return _AFTER_CALL, function.group(1)


@TOOL_CALL_PARSERS.register("openai", "gpt-oss: harmony commentary to=functions.*")
class OpenAIToolParser(ToolParser):
    needs_special_tokens = True

    def stream(self) -> ToolCallStream:
        return _HarmonyStream()


class _HarmonyStream(CallsStream):
    def __init__(self) -> None:
        super().__init__(())
        self._state = _START
        self._held = ""  # what may be the beginning of a marker, or a header so far
        self._lead = ""  # what was neither sent nor used by a call since either last happened

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        if self._state == _PLAIN:
            self._out.content(text)
            return ""
        if self._state in (_CONTENT, _ANALYSIS):
            return self._body(text)
        if self._state == _HEAD:
            return self._header(text)
        expected = {_START: (CHANNEL, START), _AFTER_CALL: (CALL,), _BETWEEN: (START,)}[self._state]
        rest = text.lstrip()
        for marker in expected:
            if rest.startswith(marker) and marker == CALL:
                end = len(text) - len(rest) + len(CALL)
                self._state = _BETWEEN  # the call's end marker is the call's, like its body
                return text[end:]
            if rest.startswith(marker):
                self._state = _HEAD
                return text
        if any(marker.startswith(rest) for marker in expected):
            self._held = text
            return ""
        if self._state == _START:
            self._state = _PLAIN
            self._out.content(text)
            return ""
        return self._bad(text)

    def _header(self, text: str) -> str:
        k = text.find(MESSAGE)
        if k < 0:
            self._held = text
            return ""
        kind, name = read_header(text[:k])
        if kind == _PLAIN:
            return self._bad(text)
        head, rest = text[: k + len(MESSAGE)], text[k + len(MESSAGE) :]
        self._state = kind
        if kind == _AFTER_CALL:
            self._begin_call(self._lead + head, ArgsCall(self._calls, name))
            self._lead = ""
        else:
            self._lead += head
        return rest

    def _body(self, text: str) -> str:
        ends = [(k, m) for m in _BODY_ENDS if (k := text.find(m)) >= 0]
        k, marker = min(ends) if ends else (min(partial_tag_start(text, m) for m in _BODY_ENDS), "")
        if self._state == _CONTENT and text[:k]:
            self._out.content(text[:k])
            self._lead = ""  # what led to it is spent
        elif self._state == _ANALYSIS:
            self._lead += text[:k]
        if not marker:
            self._held = text[k:]
            return ""
        self._state, self._lead = _BETWEEN, self._lead + marker
        return text[k + len(marker) :]

    def _bad(self, text: str) -> str:
        self._pending = self._lead + text
        return self._fail("")

    def _after_call(self) -> None:
        pass

    def _finish_outside(self) -> None:
        if self._state in (_START, _PLAIN):
            self._out.content(self._held)
        elif self._state == _CONTENT:
            self._out.content(self._held)  # it began like an end marker but the output ended
        elif self._state == _HEAD:
            self._bad(self._held)  # cut off inside a header
        # After a call, a missing <|call|> is the stop token the engine left out of the text.
