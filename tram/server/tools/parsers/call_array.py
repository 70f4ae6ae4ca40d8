"""The lead-in to each call of a list of calls (`[call, call, ...]`: Mistral before v11 and Granite
write JSON call objects, pythonic.py Python calls), read from the text held back since the list's
opening (or the last call) by matching it whole: a lead-in is a few characters, so re-matching it
as pieces arrive costs nothing."""

from __future__ import annotations

import re

MORE, CALL, CLOSED, BAD = "more", "call", "closed", "bad"
_WS = r"[ \t\n\r]*"


class ListLeadIn:
    """`call_start`: a pattern for the first character of a call (a lookahead: it is not consumed)."""

    def __init__(self, call_start: str) -> None:
        self._first = re.compile(rf"{_WS}\[{_WS}(?={call_start})")
        self._first_so_far = re.compile(rf"{_WS}(\[{_WS})?")
        self._next = re.compile(rf"{_WS},{_WS}(?={call_start})")
        self._close = re.compile(rf"{_WS}\]")
        self._next_so_far = re.compile(rf"{_WS}(,{_WS})?")

    def read(self, text: str, first: bool) -> tuple[str, int]:
        """What `text` is: (CALL, where the call begins), (CLOSED, just past the `]`), (MORE, 0)
        while it could still become either, or (BAD, 0). `first`: before the first call (the `[`
        is in `text`), else after a call."""
        call = (self._first if first else self._next).match(text)
        if call:
            return CALL, call.end()
        close = None if first else self._close.match(text)
        if close:
            return CLOSED, close.end()
        if (self._first_so_far if first else self._next_so_far).fullmatch(text):
            return MORE, 0
        return BAD, 0


JSON_CALLS = ListLeadIn(r"\{")
