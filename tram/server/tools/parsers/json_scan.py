"""Where one JSON value ends, found piece by piece as text streams in.

Not a JSON parser: it only tracks what decides the boundary (string quotes and their escapes, and
the depth of `{}`/`[]` outside strings), so it accepts text that is not JSON. Whoever uses a span
it finds checks that span with `json.loads` once it is complete.
"""

from __future__ import annotations

import re

JSON_WHITESPACE = " \t\n\r"

_STRING_STOP = re.compile(r'["\\]')
_NESTED_STOP = re.compile(r'["{}\[\]]')
# A number, true, false or null ends where a delimiter or whitespace begins.
_SCALAR_END = re.compile(r'[,:}\] \t\n\r\[{"]')

STRING, NESTED, SCALAR = "string", "nested", "scalar"


class ValueScanner:
    """Scans one JSON value, from its first (non-whitespace) character, over as many `scan`
    calls as it takes; all state between pieces lives here."""

    def __init__(self) -> None:
        self.kind: str | None = None  # STRING, NESTED or SCALAR once the first character is seen
        self._depth = 0
        self._in_string = False
        self._escaped = False  # a backslash ended the last piece: its next character is escaped

    def scan(self, text: str, pos: int = 0) -> int | None:
        """Consume `text[pos:]`; return the offset just past the value's end (for a scalar, the
        offset of the character that ends it), or None if the value goes on beyond `text`."""
        if self.kind is None:
            if pos >= len(text):
                return None
            pos = self._begin(text[pos], pos)
        while pos < len(text):
            if self._in_string:
                end = self._skip_string(text, pos)
                if end is None or self.kind == STRING:
                    return end
                pos = end
            elif self.kind == SCALAR:
                m = _SCALAR_END.search(text, pos)
                return m.start() if m else None
            else:
                end = self._skip_nested(text, pos)
                if end is None or self._depth == 0:
                    return end
                pos = end
        return None

    def _begin(self, first: str, pos: int) -> int:
        if first == '"':
            self.kind, self._in_string = STRING, True
        elif first in "{[":
            self.kind, self._depth = NESTED, 1
        else:
            self.kind = SCALAR
        return pos + 1

    def _skip_string(self, text: str, pos: int) -> int | None:
        """Past the closing quote of the string being scanned, or None if it is still open."""
        while True:
            if self._escaped:
                if pos >= len(text):
                    return None
                self._escaped, pos = False, pos + 1
            m = _STRING_STOP.search(text, pos)
            if m is None:
                return None
            pos = m.end()
            if m.group() == "\\":
                self._escaped = True
            else:
                self._in_string = False
                return pos

    def _skip_nested(self, text: str, pos: int) -> int | None:
        """Past the next quote or bracket outside strings, counting depth; None if there is none."""
        m = _NESTED_STOP.search(text, pos)
        if m is None:
            return None
        c = m.group()
        if c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        else:
            self._depth -= 1
        return m.end()
