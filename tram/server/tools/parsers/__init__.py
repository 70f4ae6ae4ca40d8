"""Tool calling: parsers that find calls in a model's own format (chosen by name, as vLLM's
--tool-call-parser), and forced tool choices (forced.py). base.py states the rules they all keep."""
from __future__ import annotations

from tram.server.tools.parsers.base import (
    DeltaMessage, DeltaToolCall, ExtractedToolCalls, ToolCall, ToolCallStream, ToolParser,
)
from tram.server.tools.parsers.hermes import HermesToolParser
from tram.server.tools.parsers.llama3_json import Llama3JsonToolParser

__all__ = [
    "DeltaMessage", "DeltaToolCall", "ExtractedToolCalls", "TOOL_PARSERS", "ToolCall", "ToolCallStream",
    "ToolParser", "get_tool_parser",
]

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
}


def get_tool_parser(name: str) -> ToolParser:
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool call parser {name!r}; known: {known}") from None
