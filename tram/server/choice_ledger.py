"""The little a streaming handler must remember between DELTA outputs (chat and completions share it).

Each output already holds only what is new, so no handler slices text or tokens; what is left is
which choices have begun, how much text each has sent, and the token counts for `include_usage`.
"""
from __future__ import annotations

from tram.outputs import CompletionOutput, RequestOutput


class ChoiceLedger:
    """Per choice (by its index in the response): whether it has begun, since its first chunk
    carries the role or the echoed prompt, and the characters it has sent, where the next chunk's
    logprobs `text_offset` starts. Per response: prompt and completion tokens for usage."""

    def __init__(self) -> None:
        self._chars_sent: dict[int, int] = {}
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
