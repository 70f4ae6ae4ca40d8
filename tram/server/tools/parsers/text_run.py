"""Text between tool calls in formats that mix prose and tagged calls (hermes.py, mistral.py,
qwen3_coder.py): a stretch of it is content once it has more than whitespace, its whitespace
included; a stretch that is only whitespace (before, between or after calls) is not content, so an
output that is calls and whitespace has no content (None). A suffix that could begin the tag that
opens a call is held back until the next text tells."""

from __future__ import annotations

from tram.server.tools.parsers.deltas import DeltaBuilder


def partial_tag_start(text: str, tag: str) -> int:
    """Where the longest suffix of `text` that could begin `tag` starts; len(text) if none."""
    for k in range(max(0, len(text) - len(tag) + 1), len(text)):
        if tag.startswith(text[k:]):
            return k
    return len(text)


def skip_end_tag(text: str, end_tag: str) -> str | None:
    """After a call: what follows whitespace and `end_tag`; the text itself when no such tag
    follows (a closing tag that never comes is forgiven: the output may stop at it as a stop
    string); None while the text may still become the tag."""
    rest = text.lstrip()
    if rest.startswith(end_tag):
        return rest[len(end_tag) :]
    if end_tag.startswith(rest):
        return None
    return text


class TextRun:
    def __init__(self, out: DeltaBuilder, tag: str) -> None:
        self._out = out
        self._tag = tag
        self._blank = ""  # the stretch so far, while it is only whitespace
        self._has_text = False  # the stretch is content

    def read(self, text: str) -> tuple[str | None, str]:
        """Take text up to the tag: (what follows the tag, the whitespace held back before it)
        once the tag is found, after which a new stretch begins; else (None, the suffix held back
        as it could begin the tag)."""
        k = text.find(self._tag)
        if k < 0:
            j = partial_tag_start(text, self._tag)
            self.add(text[:j])
            return None, text[j:]
        self.add(text[:k])
        blank, self._blank, self._has_text = self._blank, "", False
        return text[k + len(self._tag) :], blank

    def add(self, text: str) -> None:
        if self._has_text:
            self._out.content(text)
        elif text.strip():
            self._out.content(self._blank + text)
            self._blank, self._has_text = "", True
        else:
            self._blank += text

    def after_call(self) -> None:
        """A call ended: a new stretch begins."""
        self._blank, self._has_text = "", False
