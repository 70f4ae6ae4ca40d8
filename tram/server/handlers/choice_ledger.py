"""The little a streaming handler must remember between DELTA outputs (chat and completions share it).

Each output already holds only what is new, so no handler slices text or tokens; what is left is
which choices have begun, how much text each has sent, where its next logprobs token starts, and the
token counts for `include_usage`.
"""

from __future__ import annotations

from tram.outputs import CompletionOutput, RequestOutput


class ChoiceLedger:
    """Per choice (by its index in the response): whether it has begun, since its first chunk
    carries the role or the echoed prompt, the characters it has sent, and where its next logprobs
    token starts in its text (`text_offset`). Per response: prompt and completion tokens for usage."""

    def __init__(self) -> None:
        self._chars_sent: dict[int, int] = {}
        self._token_chars: dict[int, int] = {}  # where each choice's next logprobs token starts
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def count(self, out: RequestOutput) -> None:
        """Every generated token once; each request's prompt once, when the request finishes."""
        self.completion_tokens += sum(len(c.token_ids) for c in out.outputs)
        if out.finished:
            self.prompt_tokens += len(out.prompt_token_ids)

    def is_first(self, index: int) -> bool:
        return index not in self._chars_sent

    def chunk_due(self, index: int, c: CompletionOutput) -> bool:
        """A choice's first output, new text or tokens, or its finish make a chunk; an output whose
        text is all held back (a possible stop string) and that has no token makes none."""
        return self.is_first(index) or bool(c.text) or bool(c.token_ids) or c.finish_reason is not None

    def sent(self, index: int, text: str) -> int:
        """Record a chunk of `text` for this choice; return the offset at which it starts."""
        offset = self._chars_sent.get(index, 0)
        self._chars_sent[index] = offset + len(text)
        return offset

    def token_offset(self, index: int, chars: int, start: int = 0) -> int:
        """The `text_offset` of a chunk's first generated token, and count its tokens' `chars`.
        `start` places a choice's first tokens (after an echoed prompt). It differs from what
        `sent` returns when text was held back from a chunk whose tokens were sent."""
        offset = self._token_chars.get(index, start)
        self._token_chars[index] = offset + chars
        return offset
