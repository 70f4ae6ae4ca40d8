"""Thinking between `<think>` and `</think>` (DeepSeek-R1, Qwen3 and the many models trained like them).

The output may begin with `<think>` (the model opens the thinking itself) or not (the chat template
opened it in the prompt): either way the text up to `</think>` is reasoning and the text after it
content. Leading whitespace before a `<think>` goes with the tag. An output that ends before
`</think>` was cut off while thinking: all of it is reasoning, as vLLM's parsers have it.
"""

from __future__ import annotations

from tram.server.reasoning.base import ReasoningDelta, ReasoningParser, ReasoningStream, partial_suffix

START_TAG, END_TAG = "<think>", "</think>"
_START, _THINKING, _ANSWER = "start", "thinking", "answer"


class ThinkTagsParser(ReasoningParser):
    markers = (START_TAG, END_TAG)
    end_text = END_TAG

    def thinking_stream(self) -> ReasoningStream:
        return ThinkTagsStream()


class ThinkTagsStream(ReasoningStream):
    def __init__(self) -> None:
        self._state = _START
        self._held = ""  # what could still be an opening `<think>` or the start of `</think>`

    def feed(self, text: str) -> ReasoningDelta:
        text, self._held = self._held + text, ""
        if self._state == _START:
            text = self._opening(text)
            if self._state == _START:
                return ReasoningDelta()
        if self._state == _THINKING:
            return self._thinking(text)
        return ReasoningDelta(content=text)

    def _opening(self, text: str) -> str:
        """At the start: drop an opening tag (and the whitespace before it) once it is whole."""
        head = text.lstrip()
        if head.startswith(START_TAG):
            self._state = _THINKING
            return head[len(START_TAG) :]
        if START_TAG.startswith(head):  # blank, or a tag still arriving
            self._held = text
            return ""
        self._state = _THINKING  # the prompt opened the thinking
        return text

    def _thinking(self, text: str) -> ReasoningDelta:
        k = text.find(END_TAG)
        if k >= 0:
            self._state = _ANSWER
            return ReasoningDelta(reasoning=text[:k], content=text[k + len(END_TAG) :])
        j = partial_suffix(text, (END_TAG,))
        self._held = text[j:]
        return ReasoningDelta(reasoning=text[:j])

    def finish(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        # Cut off inside a tag: what arrived of it is what the model thought.
        return ReasoningDelta(content=held) if self._state == _ANSWER else ReasoningDelta(reasoning=held)
