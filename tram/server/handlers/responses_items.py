"""The output items of a Responses API answer: the model's text as a `message` item, the calls it
made as `function_call` items, whole or streamed as OpenAI streams them (each item added, filled
by its delta events, and done before the next one begins)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tram.server.tools.parsers import DeltaMessage, ToolCall, ToolCallStream

# Writes one event: its type and fields (handlers/responses.py's EventWriter).
Emit = Callable[..., str]


def new_id(prefix: str) -> str:
    """OpenAI's ids for this API: `resp_...`, `msg_...`, `fc_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A message item; `text` None while it is in progress (as streamed first: no part yet)."""
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    """A function_call item; its `call_id` is what the client's function_call_output answers."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def output_items(content: str | None, calls: list[ToolCall], status: str, message_id: str) -> list[dict[str, Any]]:
    """A whole answer's items: its text (when there is some, or nothing else), then its calls."""
    items = [message_item(message_id, content or "", status)] if content or not calls else []
    return items + [call_item(new_id("fc"), call, "completed") for call in calls]


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@dataclass
class _OpenItem:
    """The item being streamed: a message (`call` None) or a function call, and its text so far."""

    id: str
    index: int
    call: ToolCall | None = None
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ItemStream:
    """One response's items as events. Without a tool-call stream all text is one message, opened
    before any text (as a plain text response streams); with one, items open as the text turns out
    to be content or a call. `items` holds the finished items, for the final response object."""

    def __init__(self, emit: Emit, tools: ToolCallStream | None, message_id: str) -> None:
        self.emit, self.tools, self.message_id = emit, tools, message_id
        self.items: list[dict[str, Any]] = []
        self.open: _OpenItem | None = None
        self.messages = 0  # message items opened: the first takes the response's message id

    def begin(self) -> Iterator[str]:
        if self.tools is None:
            yield from self._open_message()

    def feed(self, text: str) -> Iterator[str]:
        if self.tools is None:
            yield from self._text(text)
        else:
            yield from self._delta(self.tools.feed(text))

    def end(self, status: str) -> Iterator[str]:
        """The output ended with `status` ("completed" or "incomplete"): flush, close, and make sure
        the response has an item (an empty message when the model wrote nothing)."""
        if self.tools is not None:
            yield from self._delta(self.tools.finish())
        if self.open is None and not self.items:
            yield from self._open_message()
        yield from self._close(status)

    def _delta(self, delta: DeltaMessage | None) -> Iterator[str]:
        if delta is None:
            return
        if delta.content:
            yield from self._text(delta.content)
        for d in delta.tool_calls:
            if d.id is not None:  # a call's first fragment: its id and name
                yield from self._close("completed")
                yield from self._open_call(ToolCall(d.id, d.name or "", ""))
            if d.arguments and self.open is not None and self.open.call is not None:
                self.open.pieces.append(d.arguments)
                where = {"item_id": self.open.id, "output_index": self.open.index}
                yield self.emit("response.function_call_arguments.delta", **where, delta=d.arguments)

    def _text(self, text: str) -> Iterator[str]:
        if not text:
            return
        if self.open is None or self.open.call is not None:
            yield from self._close("completed")
            yield from self._open_message()
        assert self.open is not None
        self.open.pieces.append(text)
        yield self.emit("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open.id, "output_index": self.open.index, "content_index": 0}

    def _open_message(self) -> Iterator[str]:
        item_id = self.message_id if self.messages == 0 else new_id("msg")
        self.messages += 1
        self.open = _OpenItem(item_id, len(self.items))
        item = message_item(item_id, None, "in_progress")
        yield self.emit("response.output_item.added", output_index=self.open.index, item=item)
        yield self.emit("response.content_part.added", **self._where(), part=text_part(""))

    def _open_call(self, call: ToolCall) -> Iterator[str]:
        self.open = _OpenItem(new_id("fc"), len(self.items), call)
        item = call_item(self.open.id, call, "in_progress")
        yield self.emit("response.output_item.added", output_index=self.open.index, item=item)

    def _close(self, status: str) -> Iterator[str]:
        """The open item's done events (none when no item is open)."""
        item, self.open = self.open, None
        if item is None:
            return
        if item.call is None:
            where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            yield self.emit("response.output_text.done", **where, text=item.text, logprobs=[])
            yield self.emit("response.content_part.done", **where, part=text_part(item.text))
            done = message_item(item.id, item.text, status)
        else:
            # A call already announced stays sent; cut short or malformed, it is "incomplete".
            ok = status == "completed" and _is_object(item.text)
            call = ToolCall(item.call.id, item.call.name, item.text)
            done = call_item(item.id, call, "completed" if ok else "incomplete")
            where = {"item_id": item.id, "output_index": item.index}
            yield self.emit("response.function_call_arguments.done", **where, arguments=item.text)
        self.items.append(done)
        yield self.emit("response.output_item.done", output_index=item.index, item=done)
