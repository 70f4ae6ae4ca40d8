"""One answer of the Messages API: its id, content blocks, stop_reason and usage, whole or streamed.

The chat machinery decides what the model's text is (content, or tool calls by the server's
--tool-call-parser or a forced tool_choice); this says it as Anthropic does: a `text` block and
`tool_use` blocks (the input an object, its id Anthropic-style), and chat's finish reasons as
Anthropic's stop reasons.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from tram.outputs import CompletionOutput, RequestOutput
from tram.server.reasoning.plan import ReasoningPlan
from tram.server.tools.chat import ToolPlan
from tram.server.tools.parsers import ToolCall


def new_id(prefix: str) -> str:
    """Anthropic's id style: `msg_...` for a message, `toolu_...` for a tool call."""
    return f"{prefix}_{uuid.uuid4().hex}"


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def new_signature() -> str:
    """Anthropic signs its thinking so that it can trust it when sent back; nothing here checks a
    signature, so it is a random token, as vLLM's."""
    return uuid.uuid4().hex


def thinking_block(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def tool_use_block(name: str, input_: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id("toolu"), "name": name, "input": input_}


def stop_reason(finish_reason: str | None, matched: int | str | None, stop_sequences: list[str]) -> str | None:
    """Anthropic's stop_reason for chat's finish_reason ("tool_calls" once a call was made). An
    engine-side abort has no name in Anthropic's list: None."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence"
    return {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}.get(finish_reason or "")


@dataclass
class MessageBuilder:
    """The answer of one request: what stays fixed (id, model, prompt size, tool and reasoning
    plans) and what its outputs have added so far (tokens, how it finished)."""

    model: str
    input_tokens: int
    plan: ToolPlan
    reasoning: ReasoningPlan = field(default_factory=ReasoningPlan)
    stop_sequences: list[str] = field(default_factory=list)
    id: str = field(default_factory=lambda: new_id("msg"))
    output_tokens: int = 0
    finish_reason: str | None = None
    matched: int | str | None = None  # the stop string or token id that ended it

    def add(self, out: RequestOutput) -> CompletionOutput:
        """Take in one output (a DELTA, or the final one); its one sample (this API has no `n`)."""
        (c,) = out.outputs
        self.output_tokens += len(c.token_ids)
        self.finish_reason, self.matched = c.finish_reason, c.stop_reason
        return c

    def ending(self, finish_reason: str | None) -> tuple[str | None, str | None]:
        """(stop_reason, stop_sequence) for chat's finish_reason of this output."""
        reason = stop_reason(finish_reason, self.matched, self.stop_sequences)
        return reason, self.matched if reason == "stop_sequence" and isinstance(self.matched, str) else None

    def streamed_ending(self, called: bool) -> tuple[str | None, str | None]:
        """As `ending`, where a tool call streamed turns a natural stop into tool_use."""
        return self.ending("tool_calls" if called and self.finish_reason == "stop" else self.finish_reason)

    def usage(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def body(self, content: list[dict[str, Any]], reason: str | None, sequence: str | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(),
        }

    def whole(self, text: str) -> dict[str, Any]:
        """The message for the whole output `text`: its thinking first (the server's
        --reasoning-parser), then the answer; a call cut short or malformed stays text, as on chat
        (ToolPlan.finish), so the client sees what the model wrote."""
        thought, answer = self.reasoning.split(text)
        content, calls, finish = (
            self.plan.finish(answer, self.finish_reason) if answer is not None else (None, [], self.finish_reason)
        )
        blocks = [thinking_block(thought, new_signature())] if thought else []
        blocks += [text_block(content)] if content else []
        blocks += [_call_block(call) for call in calls]
        return self.body(blocks, *self.ending(finish))


def _call_block(call: ToolCall) -> dict[str, Any]:
    # The parsers hand over only calls whose arguments are a JSON object (parsers/base.py).
    return tool_use_block(call.name, json.loads(call.arguments))
