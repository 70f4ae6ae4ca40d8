"""Reasoning: telling a thinking model's thinking from its answer (chosen by name, as vLLM's
--reasoning-parser). base.py states the rules every parser keeps.

A parser registers itself by name where it is defined (`@REASONING_PARSERS.register("qwen3", help)`
on its class); configuration validates --reasoning-parser against those names. Importing this
package imports every parser module, so that all are registered.
"""

from __future__ import annotations

from tram.config.registry import REASONING_PARSERS
from tram.server.reasoning import deepseek_r1, gptoss, qwen3  # noqa: F401 - each registers its parser
from tram.server.reasoning.base import ReasoningDelta, ReasoningParser, ReasoningStream

__all__ = ["ReasoningDelta", "ReasoningParser", "ReasoningStream", "get_reasoning_parser"]


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser registered as `name`; ValueError naming the registered ones otherwise."""
    return REASONING_PARSERS.load(name)()
