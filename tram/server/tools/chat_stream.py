"""Streamed chat choices with thinking and tools: each choice's text goes first through its reasoning
stream (the thinking becomes `reasoning_content`, the rest goes on), then the answer through its
tool-call stream, which turns it into content and `tool_calls` fragments (or passes it through when
the request has no tools)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tram.outputs import CompletionOutput
from tram.server.reasoning.base import ReasoningStream
from tram.server.reasoning.plan import ReasoningPlan, reasoning_fields
from tram.server.tools.chat import ToolPlan, delta_json
from tram.server.tools.parsers import ToolCallStream


@dataclass
class ChoiceDelta:
    body: dict[str, Any] = field(default_factory=dict)  # OpenAI's `delta`, less the role
    finish_reason: str | None = None


class ChoiceToolStreams:
    def __init__(self, plan: ToolPlan, reasoning: ReasoningPlan | None = None) -> None:
        self.plan = plan
        self.reasoning = reasoning or ReasoningPlan()
        self.streams: dict[int, ToolCallStream | None] = {}
        self.thoughts: dict[int, ReasoningStream] = {}
        self.called: set[int] = set()  # choices that sent a tool call

    def delta(self, c: CompletionOutput) -> ChoiceDelta | None:
        """This output's delta for choice `c.index`; None when there is nothing to send yet (text
        held back while it may be the start of a call) and the choice goes on."""
        if c.index not in self.streams:
            self.streams[c.index] = self.plan.new_stream()
            self.thoughts[c.index] = self.reasoning.new_stream()
        thought, answer = self._think(c)
        body: dict[str, Any] = reasoning_fields(thought) if thought and self.reasoning.include else {}
        stream = self.streams[c.index]
        if stream is None:
            if answer or self.reasoning.setup is None:
                body["content"] = answer
            return ChoiceDelta(body, c.finish_reason) if body or c.finish_reason is not None else None
        parts = [stream.feed(answer)]
        if c.finish_reason is not None:
            parts.append(stream.finish())
        for part in parts:
            if part is not None:
                _merge(body, delta_json(part))
        if body.get("tool_calls"):
            self.called.add(c.index)
        finish = c.finish_reason
        if finish == "stop" and c.index in self.called:
            finish = "tool_calls"
        if not body and finish is None:
            return None  # (the logprobs of tokens whose text is held back are not streamed)
        return ChoiceDelta(body, finish)

    def _think(self, c: CompletionOutput) -> tuple[str, str]:
        """This output's new thinking and new answer text."""
        thought = self.thoughts[c.index]
        parts = [thought.feed(c.text)]
        if c.finish_reason is not None:
            parts.append(thought.finish())
        return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


def _merge(body: dict[str, Any], part: dict[str, Any]) -> None:
    if "content" in part:
        body["content"] = body.get("content", "") + part["content"]
    if "tool_calls" in part:
        body.setdefault("tool_calls", []).extend(part["tool_calls"])
