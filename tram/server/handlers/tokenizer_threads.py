"""Where a request's text is tokenized, and how much of a long one is read before it is refused.

Tokenizing and chat templates run off the event loop (a long prompt must not stall every client and
/health), on two threads: texts up to PIECE_CHARS characters on one, in arrival order (as vLLM's
single tokenizer thread), longer ones on a second, so that one client's megabytes never queue
everyone's short prompts behind them (issue 35: three 14.7 MB /tokenize calls once held a plain
completion for 30 s). Hugging Face's fast tokenizers release the GIL while they encode and change
no state when a call asks for no truncation and no padding (none here does), so both threads share
the one tokenizer.

A long text is counted piece by piece before it is tokenized whole: as soon as its pieces hold more
tokens than the context, it is refused. Refusing a 16 MB prompt then costs about one context's worth
of tokenizing, not the whole body's, for a model whose longest token makes the character bound
(InputProcessor.check_text_length) too loose to catch it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tram.engine.input_processor import LengthRule, PromptTooLongError

T = TypeVar("T")

# About 20-60 ms of tokenizing: the longest text the ordered thread takes, and the size of a piece.
PIECE_CHARS = 64 * 1024
# A piece cut where the whole text runs on may split one word into more tokens than the whole text
# has there; this many tokens per cut are forgiven before the count proves the text too long.
_SLACK_PER_CUT = 4
# Where a piece ends: at the last space within this many characters before its end, if any.
_CUT_WINDOW = 256


class TokenizerThreads:
    """The two tokenizer threads; `run` picks one by the size of the work."""

    def __init__(self) -> None:
        self.ordered = ThreadPoolExecutor(1, thread_name_prefix="tram-tokenize")
        self.long = ThreadPoolExecutor(1, thread_name_prefix="tram-tokenize-long")

    async def run(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the thread for work of `size` (characters, or token ids to decode)."""
        pool = self.long if size > PIECE_CHARS else self.ordered
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def shutdown(self) -> None:
        for pool in (self.ordered, self.long):
            pool.shutdown(wait=False, cancel_futures=True)


def _piece_end(text: str, start: int) -> int:
    end = start + PIECE_CHARS
    if end >= len(text):
        return len(text)
    # Before a space: tokenizers attach a word's space to the word that follows it.
    space = text.rfind(" ", end - _CUT_WINDOW, end)
    return space if space > start else end


def check_token_count(tokenizer: Any, text: str, max_model_len: int, rule: LengthRule) -> None:
    """PromptTooLongError once `text`, tokenized piece by piece, holds more than `max_model_len`
    tokens; a text of one piece or less is left to the length check after tokenizing."""
    if len(text) <= PIECE_CHARS:
        return
    backend = tokenizer.backend_tokenizer  # the Rust tokenizer: a count without a list of ids
    counted, start, cuts = 0, 0, 0
    while start < len(text):
        end = _piece_end(text, start)
        cuts += end < len(text)
        counted += len(backend.encode(text[start:end], add_special_tokens=False))
        if counted - _SLACK_PER_CUT * cuts > max_model_len:
            what = rule.prompt_field
            raise PromptTooLongError(
                f"This model's maximum context length is {max_model_len} tokens. However, the first {end} "
                f"characters of your {what} already hold more than {max_model_len} tokens. Please reduce "
                f"the length of the {what}.",
                what,
            )
        start = end
