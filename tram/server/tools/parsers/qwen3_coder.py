"""Qwen3-Coder tool calls: XML inside `<tool_call>` tags, after or between content:

    Let me check.
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The text around calls is read as hermes.py reads it (a closing `</tool_call>` that never comes is
forgiven), each call by xml_call.py. The values are text in the format, so their JSON types come
from the request's tools (`with_tools`): a parameter declared a number is a number, an object is
parsed, a string stays a string. A call that is not well formed, or cut off before `</function>`,
is malformed (base.py).
"""

from __future__ import annotations

from typing import Any

from tram.config.registry import TOOL_CALL_PARSERS
from tram.server.tools.parsers.base import ToolCallStream, ToolParser
from tram.server.tools.parsers.hermes import HermesStream
from tram.server.tools.parsers.xml_call import Properties, XmlCall


@TOOL_CALL_PARSERS.register("qwen3_coder", "Qwen3-Coder: <tool_call><function=...> XML")
class Qwen3CoderToolParser(ToolParser):
    def __init__(self, properties: dict[str, dict[str, Any]] | None = None) -> None:
        self._properties = properties or {}  # a tool's name to its parameters' schemas

    def with_tools(self, tools: list[dict[str, Any]] | None) -> ToolParser:
        properties: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            function = tool.get("function") or {}
            schema = function.get("parameters")
            if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                properties[function.get("name", "")] = schema["properties"]
        return Qwen3CoderToolParser(properties)

    def stream(self) -> ToolCallStream:
        return _Qwen3CoderStream(self._properties.get)


class _Qwen3CoderStream(HermesStream):
    def __init__(self, properties: Properties) -> None:
        super().__init__()
        self._properties = properties

    def _call_at_tag(self) -> XmlCall:
        return XmlCall(self._calls, self._properties)
