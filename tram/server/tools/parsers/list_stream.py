"""Formats whose whole output is one list of calls, after an optional marker (granite.py's JSON
objects, pythonic.py's Python calls):

    <marker>[call, call, ...]<end marker>

An output whose first character (after whitespace and the marker) is not `[` is plain content, all
of it; until that character, everything is held back. Once the list begins, only whitespace (and
an end marker) may follow its `]`; anything else, or a list left open, is malformed (base.py).
"""

from __future__ import annotations

from tram.server.tools.parsers.call_array import CALL, CLOSED, MORE, ListLeadIn
from tram.server.tools.parsers.calls_stream import Call, CallsStream

_START, _PLAIN, _FIRST, _NEXT, _END = "start", "plain", "first", "next", "end"


def skip_marker(text: str, markers: tuple[str, ...]) -> str | None:
    """What follows the whitespace and marker that may begin the output; None while the text
    could still be the beginning of a marker."""
    body = text.lstrip()
    for marker in markers:
        if body.startswith(marker):
            return body[len(marker) :].lstrip()
    if any(marker.startswith(body) for marker in markers):
        return None
    return body


class ListStream(CallsStream):
    def __init__(
        self, arg_keys: tuple[str, ...], lead_in: ListLeadIn, markers: tuple[str, ...], end_markers: tuple[str, ...]
    ) -> None:
        super().__init__(arg_keys)
        self._lead_in = lead_in
        self._markers = markers
        self._end_markers = end_markers
        self._state = _START
        self._held = ""  # the start of the output, or what followed the last call, until it tells
        self._lead = ""  # what led to the call about to begin (or the list's `]`), held back

    def _next_call(self) -> Call | None:
        """The call object that begins (None: a JSON `{"name", ...}` object)."""
        return None

    def _outside(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        if self._state == _PLAIN:
            self._out.content(text)
            return ""
        if self._state == _END:
            return self._after_list(text, final=False)
        if self._state == _START:
            body = skip_marker(text, self._markers)
            if not body:
                self._held = text
                return ""
            if body[0] != "[":
                self._state = _PLAIN
                self._out.content(text)
                return ""
            self._state, self._lead = _FIRST, text[: len(text) - len(body)]
            text = body
        kind, at = self._lead_in.read(text, self._state == _FIRST)
        if kind == CALL:
            self._state = _NEXT
            self._begin_call(self._lead + text[:at], self._next_call())
            return text[at:]
        if kind == CLOSED:
            self._state, self._lead = _END, text[:at]
            return self._after_list(text[at:], final=False)
        if kind == MORE:
            self._held = text
            return ""
        return self._bad(text)

    def _after_list(self, text: str, final: bool) -> str:
        """Whitespace, and an end marker, after the `]`."""
        rest = text.strip()
        if not rest or rest in self._end_markers:
            self._held = text
        elif not final and any(m.startswith(rest) for m in self._end_markers):
            self._held = text
        else:
            self._bad(text)
        return ""

    def _bad(self, text: str) -> str:
        self._pending = self._lead + text
        return self._fail("")

    def _after_call(self) -> None:
        self._lead = ""

    def _finish_outside(self) -> None:
        if self._state == _START:
            self._out.content(self._held)  # whitespace, or the beginning of a marker: plain text
        elif self._state in (_FIRST, _NEXT):
            self._bad(self._held)  # the list never closed
        elif self._state == _END:
            self._after_list(self._held, final=True)
