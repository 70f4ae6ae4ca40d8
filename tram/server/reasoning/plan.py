"""What one chat request does about the model's thinking (the server's --reasoning-parser).

Whether the output begins with thinking is decided per request, from the rendered prompt (did the
template close the thinking?) and `chat_template_kwargs.enable_thinking`. While the model thinks, a
constraint of the request (structured outputs, a forced tool call) waits: it carries the tokens that
end the thinking to the engine, whose grammar applies from there on (vLLM's behaviour).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from tram.sampling_params import SamplingParams
from tram.server.reasoning import get_reasoning_parser
from tram.server.reasoning.base import AnswerStream, ReasoningParser, ReasoningStream

PROMPT_TAIL_TOKENS = 16  # enough of the prompt's end to see a closing marker and whitespace after it


@dataclass
class ReasoningSetup:
    """The server's parser, bound to its tokenizer (the tokens that end the thinking)."""

    parser: ReasoningParser
    end_token_ids: list[int]

    @classmethod
    def load(cls, name: str, tokenizer: Any) -> ReasoningSetup:
        """The parser registered as `name`, for this tokenizer. ValueError when the model cannot
        think in the parser's format (its vocabulary lacks the markers): the server refuses to
        start rather than misfile all text."""
        parser = get_reasoning_parser(name)
        if tokenizer is None:
            raise ValueError(f"--reasoning-parser {name} needs the model's tokenizer")
        try:
            return cls(parser, parser.end_token_ids(tokenizer))
        except ValueError as e:
            raise ValueError(f"--reasoning-parser {name}: {e}") from None

    def plan(
        self, tokenizer: Any, prompt_ids: list[int], template_kwargs: Mapping[str, Any] | None, include: bool
    ) -> ReasoningPlan:
        tail = tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        return ReasoningPlan(self, self.parser.thinks(tail, template_kwargs), include)


@dataclass
class ReasoningPlan:
    setup: ReasoningSetup | None = None  # None: the server has no reasoning parser
    thinking: bool = False  # the output begins with thinking
    include: bool = True  # the request's include_reasoning

    def new_stream(self) -> ReasoningStream:
        return self.setup.parser.stream(self.thinking) if self.setup is not None else AnswerStream()

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole choice; the reasoning None when the request leaves it out."""
        if self.setup is None:
            return None, text
        reasoning, content = self.setup.parser.split(text, self.thinking)
        return (reasoning if self.include else None), content

    def apply(self, params: SamplingParams) -> None:
        """The request's constraint waits for the thinking to end; special-token markers stay in the text."""
        if self.setup is None:
            return
        if self.setup.parser.needs_special_tokens:
            params.skip_special_tokens = False
        if self.thinking and params.structured_outputs is not None:
            params.structured_outputs = msgspec.structs.replace(
                params.structured_outputs, reasoning_end=list(self.setup.end_token_ids)
            )


def reasoning_fields(text: str | None) -> dict[str, Any]:
    """The thinking as a message or delta carries it: `reasoning_content` (DeepSeek's name, which
    most clients read) and `reasoning` (vLLM's current name, after OpenAI's guidance for gpt-oss)."""
    return {"reasoning_content": text, "reasoning": text}
