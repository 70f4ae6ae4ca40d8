"""gpt-oss (OpenAI's harmony format): the thinking is the analysis channel, the answer the final one.

After the prompt's `<|start|>assistant`, the model writes messages, each a header and a body:

    <|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!

A body ends at `<|end|>`, `<|call|>` or `<|return|>` (or where the output ends). The bodies of the
analysis channel are reasoning, those of the final channel content; a message on any other channel
(commentary: a tool call, `to=functions.NAME`) goes on as content verbatim, header and end included,
for the tool-call parser to read. Text that begins with no header is an answer. The markers are
special tokens, so the detokenizer keeps them in the text for this parser. The thinking ends where
the final channel begins: the grammar of structured outputs applies from there.
"""

from __future__ import annotations

import re

from tram.config.registry import REASONING_PARSERS
from tram.server.reasoning.base import ReasoningDelta, ReasoningParser, ReasoningStream, partial_suffix

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*(\w+)")
_HEADER, _BODY = "header", "body"


@REASONING_PARSERS.register("openai_gptoss", "gpt-oss: the analysis channel of the harmony format")
class GptOssReasoningParser(ReasoningParser):
    markers = (START, CHANNEL, MESSAGE, "<|end|>")
    end_text = CHANNEL + "final" + MESSAGE
    needs_special_tokens = True

    def thinking_stream(self) -> ReasoningStream:
        return HarmonyStream()


class HarmonyStream(ReasoningStream):
    def __init__(self) -> None:
        self._state = _HEADER
        self._held = ""  # a header still arriving, or what could begin a body's end
        self._channel = ""  # the current body's channel: "analysis", "final", or another
        self._raw = False  # this body goes on verbatim (another channel's message)

    def feed(self, text: str) -> ReasoningDelta:
        text, self._held = self._held + text, ""
        out = ReasoningDelta()
        while text:
            text = self._header(text, out) if self._state == _HEADER else self._body(text, out)
        return out

    def _header(self, text: str, out: ReasoningDelta) -> str:
        if not (text.startswith((START, CHANNEL)) or START.startswith(text) or CHANNEL.startswith(text)):
            self._begin_body("final", raw=False)  # no header: the model just answers
            return text
        k = text.find(MESSAGE)
        if k < 0:
            self._held = text
            return ""
        header, rest = text[: k + len(MESSAGE)], text[k + len(MESSAGE) :]
        match = _CHANNEL_NAME.search(header)
        channel = match.group(1) if match else ""
        raw = channel not in ("analysis", "final") or " to=" in header
        self._begin_body(channel, raw)
        if raw:
            out.content += header
        return rest

    def _begin_body(self, channel: str, raw: bool) -> None:
        self._state, self._channel, self._raw = _BODY, channel, raw

    def _body(self, text: str, out: ReasoningDelta) -> str:
        ends = [(text.find(e), e) for e in BODY_ENDS if e in text]
        if ends:
            k, end = min(ends)
            self._emit(text[:k] + (end if self._raw else ""), out)
            self._state = _HEADER
            return text[k + len(end) :]
        j = partial_suffix(text, BODY_ENDS)
        self._emit(text[:j], out)
        self._held = text[j:]
        return ""

    def _emit(self, text: str, out: ReasoningDelta) -> None:
        if self._channel == "analysis" and not self._raw:
            out.reasoning += text
        else:
            out.content += text

    def finish(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        out = ReasoningDelta()
        if self._state == _BODY:
            self._emit(held, out)
        else:
            out.content += held  # a header cut off: what the model wrote, never dropped
        return out
