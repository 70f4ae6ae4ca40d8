"""The growing output text of one sample, kept so that a step costs O(new text), not O(text so far).

A `str` is immutable and `self.text += piece` on an attribute is never done in place, so appending
that way copies the whole text every step. The buffer keeps the pieces instead, reads the newest
characters by walking back from the end, and joins everything only when the whole text is asked
for (a final or cumulative output). Every `_COMPACT_EVERY` appends the newest pieces are joined
into one, so memory stays close to one byte per character however many steps produced the text.
"""

from __future__ import annotations

_COMPACT_EVERY = 64


class TextBuffer:
    """Append-only text (with truncation of its end) whose newest characters are cheap to read."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._length = 0
        self._loose = 0  # pieces at the end not joined into a compacted one yet

    def __len__(self) -> int:
        return self._length

    def append(self, piece: str) -> None:
        if not piece:
            return
        self._pieces.append(piece)
        self._length += len(piece)
        self._loose += 1
        if self._loose == _COMPACT_EVERY:
            joined = "".join(self._pieces[-_COMPACT_EVERY:])
            del self._pieces[-_COMPACT_EVERY:]
            self._pieces.append(joined)
            self._loose = 0

    def text(self) -> str:
        """The whole text: O(length) after an append, O(1) when asked again without one."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
            self._loose = 0
        return self._pieces[0] if self._pieces else ""

    def suffix(self, start: int) -> str:
        """`text()[start:]` in time proportional to the characters returned."""
        remaining = self._length - max(start, 0)
        if remaining <= 0:
            return ""
        last = self._pieces[-1]
        if len(last) >= remaining:  # the common case: the range lies in the newest piece
            return last[len(last) - remaining :]
        parts: list[str] = []
        for piece in reversed(self._pieces):
            if remaining <= 0:
                break
            if len(piece) >= remaining:
                parts.append(piece[len(piece) - remaining :])  # copies only the part needed
                break
            parts.append(piece)
            remaining -= len(piece)
        return "".join(reversed(parts))

    def slice(self, start: int, end: int) -> str:
        """`text()[start:end]` for a range near the end, in time proportional to `length - start`."""
        start, end = max(start, 0), max(end, 0)  # as str slicing clamps them (within the text's length)
        return self.suffix(start)[: max(end - start, 0)]

    def truncate(self, length: int) -> None:
        """Keep the first `length` characters. Only a stop string cuts the text, once per sample."""
        drop = self._length - length
        while drop > 0:
            last = self._pieces[-1]
            if len(last) > drop:
                self._pieces[-1] = last[: len(last) - drop]
                break
            self._pieces.pop()
            drop -= len(last)
        self._length = min(self._length, max(length, 0))
        self._loose = min(self._loose, len(self._pieces))
