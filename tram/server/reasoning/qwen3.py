"""Qwen3 (and SmolLM3, and others with Qwen3's template): `<think>` ... `</think>`, then the answer.

The template's `enable_thinking` switch (chat_template_kwargs) turns thinking off: the template then
writes an empty `<think>\\n\\n</think>\\n\\n` into the prompt, and the whole output is content (as
it is for a template that writes nothing, when the request says enable_thinking false).
"""

from __future__ import annotations

from tram.config.registry import REASONING_PARSERS
from tram.server.reasoning.think_tags import ThinkTagsParser


@REASONING_PARSERS.register("qwen3", "Qwen3: <think> ... </think>, off with enable_thinking false")
class Qwen3ReasoningParser(ThinkTagsParser):
    honours_enable_thinking = True
