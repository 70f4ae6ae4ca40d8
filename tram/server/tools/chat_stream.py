"""Streamed chat choices with tools: each choice's text goes through its tool-call stream, which turns
it into content and `tool_calls` fragments (or passes it through when the request has no tools)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tram.outputs import CompletionOutput
from tram.server.tools.chat import ToolPlan, delta_json
from tram.server.tools.parsers import ToolCallStream


@dataclass
class ChoiceDelta:
    body: dict[str, Any] = field(default_factory=dict)  # OpenAI's `delta`, less the role
    finish_reason: str | None = None


class ChoiceToolStreams:
    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.streams: dict[int, ToolCallStream | None] = {}
        self.called: set[int] = set()  # choices that sent a tool call

    def delta(self, c: CompletionOutput) -> ChoiceDelta | None:
        """This output's delta for choice `c.index`; None when there is nothing to send yet (text
        held back while it may be the start of a call) and the choice goes on."""
        if c.index not in self.streams:
            self.streams[c.index] = self.plan.new_stream()
        stream = self.streams[c.index]
        if stream is None:
            return ChoiceDelta({"content": c.text}, c.finish_reason)
        parts = [stream.feed(c.text)]
        if c.finish_reason is not None:
            parts.append(stream.finish())
        body: dict[str, Any] = {}
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


def _merge(body: dict[str, Any], part: dict[str, Any]) -> None:
    if "content" in part:
        body["content"] = body.get("content", "") + part["content"]
    if "tool_calls" in part:
        body.setdefault("tool_calls", []).extend(part["tool_calls"])
