"""What every tool parser returns, streamed or not, and the interface it implements.

A model calls tools by writing them out in its own format (hermes.py, llama3_json.py); a parser
turns that text back into OpenAI tool calls. The rules all parsers keep:

- `ToolCall.arguments` is the model's own JSON text of the arguments object, verbatim: sliced out of
  the output (no surrounding whitespace) once the call as a whole parses and the arguments are an
  object. Re-serialising would make streamed and non-streamed text differ (key order, spacing,
  escapes); slicing makes them the same by construction. Formats whose arguments are not JSON in
  the text (pythonic's Python literals, qwen3_coder's XML) make the JSON text, by the same steps
  streamed or not.
- Streamed, for any way the output is cut into pieces, the content deltas concatenate to the
  non-streamed `content` (None counted as ""), and per tool-call index the first `DeltaToolCall`
  carries the call's id and name (the id is never sent again) and the `arguments` fragments
  concatenate to the non-streamed `arguments`. Ids are random: each stream uses one per call.
- A malformed call (invalid JSON, no name, arguments that are not an object, cut off before its
  object closes) never raises. Non-streamed, the whole output is then content and no call is made.
  Streamed, nothing already sent can be taken back: text sent as content stays content, a call
  whose name or argument fragments were sent stays sent, and from the malformed call on, the text
  no complete call used (held back until then) goes out as content: as soon as the call is known
  to be malformed, or at `finish()` when the output ends inside it. When the first call is the
  malformed one, the streamed content is therefore the whole output, as non-streamed.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def new_tool_call_id() -> str:
    return "chatcmpl-tool-" + uuid.uuid4().hex


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


@dataclass
class DeltaToolCall:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class DeltaMessage:
    content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)


class ToolCallStream(ABC):
    """One request's streaming state: fed each new piece of generated text, in order."""

    # Set once a call turned out malformed; a non-streamed parse then gives up on tool calls.
    malformed: bool = False

    @abstractmethod
    def feed(self, delta_text: str) -> DeltaMessage | None:
        """What the new text (any length, possibly empty) lets us send; None if nothing yet."""

    @abstractmethod
    def finish(self) -> DeltaMessage | None:
        """The output has ended: send whatever was held back."""


class ToolParser(ABC):
    """Stateless, so one instance may serve every request; per-request state lives in a stream."""

    # Its markers are special tokens: the detokenizer must keep them in the text (vLLM's parsers
    # turn skip_special_tokens off for the same reason).
    needs_special_tokens = False

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh stream for one request."""

    def with_tools(self, tools: list[dict[str, Any]] | None) -> ToolParser:
        """This parser for a request offering `tools` (OpenAI's `{"type": "function", ...}` dicts).
        A format whose text loses the arguments' types (qwen3_coder's XML) reads them from the
        tools' schemas; the others need not look, and are their own answer."""
        return self

    def extract_tool_calls(self, model_output: str) -> ExtractedToolCalls:
        """The whole output at once. It runs the very stream a streamed request runs, fed one
        piece, so the two cannot disagree on what is a call and what is content."""
        stream = self.stream()
        content, calls = collect_deltas([stream.feed(model_output), stream.finish()])
        if stream.malformed:
            return ExtractedToolCalls(tools_called=False, tool_calls=[], content=model_output)
        return ExtractedToolCalls(tools_called=bool(calls), tool_calls=calls, content=content or None)


def collect_deltas(deltas: Iterable[DeltaMessage | None]) -> tuple[str, list[ToolCall]]:
    """The content and the calls that a sequence of deltas adds up to (calls by index)."""
    content: list[str] = []
    calls: dict[int, ToolCall] = {}
    for delta in deltas:
        if delta is None:
            continue
        content.append(delta.content or "")
        for d in delta.tool_calls:
            call = calls.setdefault(d.index, ToolCall(d.id or "", d.name or "", ""))
            call.arguments += d.arguments or ""
    return "".join(content), [calls[i] for i in sorted(calls)]
