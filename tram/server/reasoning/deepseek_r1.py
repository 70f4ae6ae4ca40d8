"""DeepSeek-R1 and its distills: `<think>` ... `</think>`, then the answer.

R1's chat template ends the prompt with `<think>\\n`, so the output usually has no opening tag: the
text up to `</think>` is reasoning. The template has no switch to turn thinking off; a prompt that
ends the thinking itself (an empty `<think></think>`) still makes the whole output content.
"""

from __future__ import annotations

from tram.config.registry import REASONING_PARSERS
from tram.server.reasoning.think_tags import ThinkTagsParser


@REASONING_PARSERS.register("deepseek_r1", "DeepSeek-R1 and its distills: <think> ... </think>")
class DeepSeekR1ReasoningParser(ThinkTagsParser):
    pass
