"""The thinking on the Responses API: a `reasoning` item before the answer's items, as vLLM returns
it (`content`: one `reasoning_text` part; no summary), whole or streamed (the item added, its part
added, `response.reasoning_text.delta` events, then the part and the item done) before the answer's
first item opens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tram.server.reasoning.plan import ReasoningPlan

Emit = Callable[..., str]  # writes one event: its type and fields


class AnswerItems(Protocol):
    """The answer's item stream (handlers/responses_items.py's ItemStream)."""

    items: list[dict[str, Any]]

    def begin(self) -> Iterator[str]: ...
    def feed(self, text: str) -> Iterator[str]: ...
    def end(self, status: str) -> Iterator[str]: ...


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A reasoning item; `text` None while it is in progress (streamed first: no part yet)."""
    content = [] if text is None else [reasoning_part(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def whole_items(plan: ReasoningPlan, text: str, status: str, item_id: str) -> tuple[list[dict[str, Any]], str]:
    """A whole output's reasoning item (none without thinking, or when left out) and its answer
    text. The item is complete once an answer follows; else it has the response's `status`."""
    thought, answer = plan.split(text)
    if not thought:
        return [], answer or ""
    return [reasoning_item(item_id, thought, "completed" if answer else status)], answer or ""


class ReasoningItems:
    """The events of one streamed response's items: the thinking as a reasoning item, then the
    answer's items, which open only once the thinking is over."""

    def __init__(self, emit: Emit, plan: ReasoningPlan, answer: AnswerItems, item_id: str) -> None:
        self.emit, self.answer, self.item_id = emit, answer, item_id
        self.thought = plan.new_stream()
        self.include = plan.include
        self.pieces: list[str] | None = None  # the open reasoning item's text; None when none is open
        self.answering = False

    @property
    def items(self) -> list[dict[str, Any]]:
        return self.answer.items

    def begin(self) -> Iterator[str]:
        return iter(())  # the answer's items wait: thinking may come first

    def feed(self, text: str) -> Iterator[str]:
        delta = self.thought.feed(text)
        yield from self._think(delta.reasoning)
        yield from self._answer(delta.content)

    def end(self, status: str) -> Iterator[str]:
        delta = self.thought.finish()
        yield from self._think(delta.reasoning)
        yield from self._answer(delta.content)
        yield from self._close(status)
        # No answer came: the answer's stream adds an empty message only if there is no item at all.
        yield from self.answer.end(status)

    def _think(self, text: str) -> Iterator[str]:
        if not text or not self.include or self.answering:
            return
        where = {"item_id": self.item_id, "output_index": len(self.items), "content_index": 0}
        if self.pieces is None:
            self.pieces = []
            item = reasoning_item(self.item_id, None, "in_progress")
            yield self.emit("response.output_item.added", output_index=len(self.items), item=item)
            yield self.emit("response.content_part.added", **where, part=reasoning_part(""))
        self.pieces.append(text)
        yield self.emit("response.reasoning_text.delta", **where, delta=text)

    def _answer(self, text: str) -> Iterator[str]:
        if not text:
            return
        if not self.answering:
            yield from self._close("completed")
            self.answering = True
            yield from self.answer.begin()
        yield from self.answer.feed(text)

    def _close(self, status: str) -> Iterator[str]:
        if self.pieces is None:
            return
        text, self.pieces = "".join(self.pieces), None
        where = {"item_id": self.item_id, "output_index": len(self.items), "content_index": 0}
        yield self.emit("response.reasoning_text.done", **where, text=text)
        yield self.emit("response.content_part.done", **where, part=reasoning_part(text))
        done = reasoning_item(self.item_id, text, status)
        yield self.emit("response.output_item.done", output_index=len(self.items), item=done)
        self.items.append(done)
