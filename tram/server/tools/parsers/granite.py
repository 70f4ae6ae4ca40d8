"""Granite 3.x tool calls: the whole output is a JSON array of call objects (list_stream.py), after
the `<|tool_call|>` token (Granite 3.1+) or the `<tool_call>` text (Granite 3.0), which a decoder
skipping special tokens may have dropped:

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]
"""

from __future__ import annotations

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.call_array import JSON_CALLS
from tram.server.tools.parsers.list_stream import ListStream

MARKERS = ("<|tool_call|>", "<tool_call>")


@TOOL_CALL_PARSERS.register("granite", "Granite 3.x: <|tool_call|>[...]")
class GraniteToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return ListStream(("arguments",), JSON_CALLS, MARKERS, ())
