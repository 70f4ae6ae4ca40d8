"""A streamed answer of the Messages API, in Anthropic's events (each an `event:` line and a `data:`
line, which the SDK reads by name):

    message_start, then per content block content_block_start, content_block_delta (thinking_delta,
    text_delta or input_json_delta)..., content_block_stop; one ping after the first block starts;
    message_delta (stop_reason, stop_sequence, usage), message_stop.

The text goes through the request's reasoning stream, then the answer through its tool-call stream
(as on chat): the thinking becomes a thinking block (its signature in a signature_delta as it
closes), content fragments a text block, each call a tool_use block whose input arrives as JSON
fragments. A failure after the status line is an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from tram.engine.async_llm import RequestStream
from tram.outputs import CompletionOutput
from tram.server.handlers.anthropic_errors import error_event
from tram.server.handlers.anthropic_message import MessageBuilder, new_signature, thinking_block, tool_use_block
from tram.server.reasoning.base import ReasoningStream
from tram.server.tools.parsers import DeltaMessage, ToolCallStream


def event(kind: str, **fields: Any) -> str:
    payload = json.dumps({"type": kind, **fields}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n"


class ContentBlocks:
    """The content blocks of one streamed message: which one is open, and the events that open,
    extend and close them. Blocks are numbered from 0 in the order they start."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use"
        self.called = False  # a tool_use block was started
        self.pinged = False

    def delta(self, message: DeltaMessage | None) -> list[str]:
        """The events of what a tool-call stream let through: its content, then its calls."""
        if message is None:
            return []
        events = self.text(message.content) if message.content else []
        for call in message.tool_calls:
            if call.name is not None:  # the first fragment of a call: a new block
                events += self._start(tool_use_block(call.name, {}))
                self.called = True
            if call.arguments:
                # Parsers send each call whole before the next starts: fragments are the open block's.
                events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return events

    def text(self, text: str) -> list[str]:
        events = [] if self.open == "text" else self._start({"type": "text", "text": ""})
        return events + [self._delta({"type": "text_delta", "text": text})]

    def thinking(self, text: str) -> list[str]:
        events = [] if self.open == "thinking" else self._start(thinking_block("", ""))
        return events + [self._delta({"type": "thinking_delta", "thinking": text})]

    def close(self) -> list[str]:
        """Close the open block; a message that never opened one still gets its ping."""
        events = []
        if self.open == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": new_signature()}))
        if self.open is not None:
            events.append(event("content_block_stop", index=self.index))
        self.open = None
        if not self.pinged:
            self.pinged = True
            events.append(event("ping"))
        return events

    def _start(self, block: dict[str, Any]) -> list[str]:
        events = self.close() if self.open is not None else []
        self.index += 1
        self.open = block["type"]
        events.append(event("content_block_start", index=self.index, content_block=block))
        if not self.pinged:  # where Anthropic sends its ping
            self.pinged = True
            events.append(event("ping"))
        return events

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", index=self.index, delta=delta)


def _output_events(
    c: CompletionOutput, thoughts: ReasoningStream, tools: ToolCallStream | None, blocks: ContentBlocks
) -> list[str]:
    """The events of one output: its new thinking, then what the tool-call stream lets through
    of its new answer."""
    finished = c.finish_reason is not None
    parts = [thoughts.feed(c.text)] + ([thoughts.finish()] if finished else [])
    thought, answer = "".join(p.reasoning for p in parts), "".join(p.content for p in parts)
    events = blocks.thinking(thought) if thought else []
    if tools is None:
        pieces = [DeltaMessage(content=answer)]
    else:
        pieces = [tools.feed(answer)] + ([tools.finish()] if finished else [])
    for piece in pieces:
        events += blocks.delta(piece)
    return events


async def stream_message(message: MessageBuilder, stream: RequestStream) -> AsyncIterator[str]:
    """The events of one answer. Leaving early (a client gone) aborts the request."""
    blocks = ContentBlocks()
    thoughts, tools = message.reasoning.new_stream(), message.plan.new_stream()
    try:
        yield event("message_start", message=message.body([], None, None))
        async for out in stream:
            for e in _output_events(message.add(out), thoughts, tools, blocks):
                yield e
        for e in blocks.close():
            yield e
        reason, sequence = message.streamed_ending(blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield event("message_delta", delta=delta, usage=message.usage())
        yield event("message_stop")
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
        yield error_event(e)
    finally:
        await stream.aclose()
