"""Tool calling: parsers that find calls in a model's own format (chosen by name, as vLLM's
--tool-call-parser), and forced tool choices (forced.py). base.py states the rules they all keep.

A parser registers itself by name where it is defined (`@TOOL_CALL_PARSERS.register("hermes", help)`
on its class); configuration validates --tool-call-parser against those names, and a reasoning
parser would register the same way with a kind of its own. Importing this package imports every
parser module, so that all are registered.
"""

from __future__ import annotations

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers import (  # noqa: F401 - each registers its parser
    granite,
    hermes,
    llama3_json,
    mistral,
    openai,
    pythonic,
    qwen3_coder,
)
from tram.server.tools.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCalls,
    ToolCall,
    ToolCallStream,
    ToolParser,
)

__all__ = [
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedToolCalls",
    "TOOL_PARSERS",
    "ToolCall",
    "ToolCallStream",
    "ToolParser",
    "get_tool_parser",
]

TOOL_PARSERS = TOOL_CALL_PARSERS  # the registered parsers' names (iterating gives them)


def get_tool_parser(name: str) -> ToolParser:
    """A fresh parser registered as `name`; ValueError naming the registered ones otherwise."""
    return TOOL_CALL_PARSERS.load(name)()
