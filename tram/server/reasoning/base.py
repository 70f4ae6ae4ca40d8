"""What every reasoning parser returns, streamed or not, and the interface it implements.

A thinking model writes its thinking first, between markers of its own (`<think>` ... `</think>`,
gpt-oss's analysis channel), then its answer; a parser tells the two apart, as vLLM's
--reasoning-parser does. The rules all parsers keep:

- Streamed, for any way the output is cut into pieces, the reasoning pieces concatenate to the
  non-streamed reasoning and the content pieces to the non-streamed content (None counted as "").
  Text that could be the start of a marker is held back until the next text tells.
- The markers themselves are neither reasoning nor content.
- Only the content goes on to the tool-call parser.
- A parser names the marker tokens it needs in the vocabulary; a model without them cannot think in
  this format, so the server refuses to start with that parser rather than pass all text as
  reasoning (or all as content) without a word.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ReasoningStream(ABC):
    """One choice's streaming state: fed each new piece of generated text, in order."""

    @abstractmethod
    def feed(self, text: str) -> ReasoningDelta:
        """What the new text (any length, possibly empty) lets us send."""

    @abstractmethod
    def finish(self) -> ReasoningDelta:
        """The output has ended: send whatever was held back."""


class AnswerStream(ReasoningStream):
    """A choice that does not think (the prompt closed the thinking): all of it is content."""

    def feed(self, text: str) -> ReasoningDelta:
        return ReasoningDelta(content=text)

    def finish(self) -> ReasoningDelta:
        return ReasoningDelta()


class ReasoningParser(ABC):
    """Stateless, so one instance serves every request; per-choice state lives in a stream."""

    markers: tuple[str, ...] = ()  # the tokens the vocabulary must have, one each
    end_text: str = ""  # the text whose tokens end the thinking (the grammar applies after them)
    # The chat template's `enable_thinking` (chat_template_kwargs) switches thinking off.
    honours_enable_thinking = False
    # The markers are special tokens: the detokenizer must keep them in the text.
    needs_special_tokens = False

    @abstractmethod
    def thinking_stream(self) -> ReasoningStream:
        """A fresh stream for one choice of a request whose model thinks first."""

    def prompt_closes_thinking(self, prompt_tail: str) -> bool:
        """The template ended the thinking itself (Qwen3 with enable_thinking false writes an empty
        `<think></think>`): the prompt's text ends with the end marker, up to whitespace."""
        return prompt_tail.rstrip().endswith(self.end_text)

    def thinks(self, prompt_tail: str, template_kwargs: Mapping[str, Any] | None) -> bool:
        """Whether this request's output begins with thinking."""
        if self.honours_enable_thinking and (template_kwargs or {}).get("enable_thinking", True) is False:
            return False
        return not self.prompt_closes_thinking(prompt_tail)

    def stream(self, thinking: bool) -> ReasoningStream:
        return self.thinking_stream() if thinking else AnswerStream()

    def split(self, text: str, thinking: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output, each None when empty. It runs the stream a
        streamed request runs, fed one piece, so the two cannot disagree."""
        stream = self.stream(thinking)
        reasoning, content = join_deltas([stream.feed(text), stream.finish()])
        return reasoning or None, content or None

    def end_token_ids(self, tokenizer: Any) -> list[int]:
        """The token ids that end the thinking in this tokenizer; ValueError naming the markers
        its vocabulary lacks."""
        vocab = tokenizer.get_vocab()
        missing = [m for m in self.markers if m not in vocab]
        if missing:
            raise ValueError(
                f"the model's vocabulary has no {', '.join(missing)} token: it does not think in the "
                f"format this reasoning parser reads"
            )
        if self.end_text in vocab:  # one token: no tokenizer's prefix space can get in the way
            return [vocab[self.end_text]]
        return list(tokenizer.encode(self.end_text, add_special_tokens=False))


def join_deltas(deltas: Iterable[ReasoningDelta]) -> tuple[str, str]:
    """The reasoning and the content that a sequence of deltas adds up to."""
    deltas = list(deltas)
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


def partial_suffix(text: str, tags: Iterable[str]) -> int:
    """Where the longest suffix of `text` that could begin one of `tags` starts; len(text) if none."""
    start = len(text)
    for tag in tags:
        for k in range(max(0, len(text) - len(tag) + 1), len(text)):
            if k < start and tag.startswith(text[k:]):
                start = k
                break
    return start
