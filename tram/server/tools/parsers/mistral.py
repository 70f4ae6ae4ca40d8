"""Mistral tool calls, after any content, in both of Mistral's formats:

    Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]    (v3-v10)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}           (v11+)

V11 may put `[CALL_ID]<id>` between the name and `[ARGS]` (its id is not used), and a decoder that
drops `[ARGS]` leaves `name{...}`: both are read. The markers are special tokens, so the request
must keep them in the text (`skip_special_tokens: false`). Text around the calls is content when it
has more than whitespace (text_run.py); after an array's `]` text is content again. `[TOOL_CALLS]`
followed by anything else, an array left open at the end, or a call that is not well formed is
malformed (base.py). Ids are 9 letters and digits: Mistral's templates refuse any other id.
"""

from __future__ import annotations

import random
import re
import string

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.args_call import ArgsCall
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.call_array import BAD, CALL, CLOSED, JSON_CALLS, MORE
from tram.server.tools.parsers.calls_stream import CallsStream
from tram.server.tools.parsers.text_run import TextRun

TOOL_CALLS, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_TEXT, _HEAD, _ARRAY_FIRST, _ARRAY_NEXT = "text", "head", "array_first", "array_next"
_NAME = re.compile(r"[A-Za-z0-9_.-]*")
_ID = re.compile(r"[A-Za-z0-9]*")
_ALPHANUMERIC = string.ascii_letters + string.digits
_rng = random.SystemRandom()


def mistral_call_id() -> str:
    return "".join(_rng.choice(_ALPHANUMERIC) for _ in range(9))


def read_v11_head(body: str) -> tuple[str, str, int]:
    """`name([CALL_ID]id)?([ARGS])?` before the arguments' `{`: (CALL, name, where the `{` is),
    (MORE, "", 0) while it could still become one, or (BAD, "", 0)."""
    name = _NAME.match(body).group()  # type: ignore[union-attr] - the pattern matches ""
    pos = len(name)
    for marker, ident in ((CALL_ID, _ID), (ARGS, None)):
        rest = body[pos:]
        if marker.startswith(rest):
            return MORE, "", 0  # the name, an id or a marker may go on
        if rest.startswith(marker):
            pos += len(marker)
            if ident is not None:
                pos = ident.match(body, pos).end()  # type: ignore[union-attr]
    brace = len(body) - len(body[pos:].lstrip(" \t\n\r"))
    if brace == len(body):
        return MORE, "", 0
    return (CALL, name, brace) if name and body[brace] == "{" else (BAD, "", 0)


@TOOL_CALL_PARSERS.register("mistral", "Mistral, Mixtral, Devstral: [TOOL_CALLS], old and v11+ forms")
class MistralToolParser(ToolParser):
    needs_special_tokens = True

    def stream(self) -> ToolCallStream:
        return _MistralStream()


class _MistralStream(CallsStream):
    def __init__(self) -> None:
        super().__init__(("arguments",))
        self._state = _TEXT
        self._run = TextRun(self._out, TOOL_CALLS)
        self._held = ""  # in text: what could begin the tag; else the lead-in read so far
        self._lead = ""  # the whitespace and tag before the lead-in: not content unless it fails

    def _new_id(self) -> str:
        return mistral_call_id()

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        if self._state == _TEXT:
            return self._text(text)
        if self._state == _HEAD and not text.lstrip().startswith("["):
            return self._v11(text)
        kind, at = JSON_CALLS.read(text, self._state != _ARRAY_NEXT)
        if kind == CALL:
            self._state = _ARRAY_NEXT
            self._begin_call(self._lead + text[:at])
            return text[at:]
        if kind == CLOSED:
            self._state, self._lead = _TEXT, ""
            return text[at:]
        if kind == MORE:
            self._held = text
            return ""
        return self._bad(text)

    def _text(self, text: str) -> str:
        rest, held = self._run.read(text)
        if rest is None:
            self._held = held
            return ""
        self._state, self._lead = _HEAD, held + TOOL_CALLS
        return rest

    def _v11(self, text: str) -> str:
        body = text.lstrip()
        kind, name, at = read_v11_head(body)
        if kind == MORE:
            self._held = text
            return ""
        if kind == BAD:
            return self._bad(text)
        at += len(text) - len(body)
        self._state = _TEXT
        self._begin_call(self._lead + text[:at], ArgsCall(self._calls, name, self._new_id()))
        return text[at:]

    def _bad(self, text: str) -> str:
        self._pending = self._lead + text
        return self._fail("")

    def _after_call(self) -> None:
        self._lead = ""
        self._run.after_call()

    def _finish_outside(self) -> None:
        if self._state == _TEXT:
            self._run.add(self._held)  # it began like the tag but the output ended
        else:
            self._bad(self._held)  # the output ended after the tag, or inside an open array
