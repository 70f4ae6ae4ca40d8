"""Tool calling on /v1/chat/completions: the request's `tools` and `tool_choice`, and what becomes of
the model's text.

- "none" (the default without tools): plain text. The template still sees the tools, as vLLM.
- "required" or a named function: a JSON-schema grammar built from the tools' parameters makes the
  model write exactly the calls (parsers/forced.py), so even a tiny model calls validly.
- "auto" (the default with tools): the model decides; the server's --tool-call-parser finds the
  calls in its text. Without --enable-auto-tool-choice that is a 400, as in vLLM.

Calls come back as `message.tool_calls` (streamed: `delta.tool_calls`, id and name first, then
argument fragments) with finish_reason "tool_calls".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tram.sampling_params import SamplingParamError, SamplingParams, StructuredOutputsParams
from tram.sampling_params.client_json import JSONTooDeepError, loads_bounded, too_deep
from tram.server.protocol.errors import APIError
from tram.server.tools.parsers import DeltaMessage, ToolCall, ToolCallStream, ToolParser
from tram.server.tools.parsers.forced import ForcedToolStream, forced_tool_schema, parse_forced_tool_calls


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass
class ToolPlan:
    """What one chat request does about tools; `mode` is "none", "auto" or "forced"."""

    tools: list[dict[str, Any]] | None
    mode: str
    choice: str | dict[str, Any]
    parser: ToolParser | None = None

    def structured_outputs(self, parallel: bool | None) -> StructuredOutputsParams | None:
        if self.mode != "forced":
            return None
        schema = forced_tool_schema(self.tools or [], self.choice, parallel)
        return StructuredOutputsParams(json=schema, source_field="tool_choice")

    @property
    def needs_special_tokens(self) -> bool:
        """The parser reads markers that are special tokens: the request must keep them in its text."""
        return self.mode == "auto" and self.parser is not None and self.parser.needs_special_tokens

    def new_stream(self) -> ToolCallStream | None:
        if self.mode == "forced":
            return ForcedToolStream(self.choice)
        if self.mode == "auto" and self.parser is not None:
            return self.parser.stream()
        return None

    def finish(self, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """(content, tool calls, finish_reason) of a whole choice. A call cut short by max_tokens, or
        malformed, stays text: the client sees what the model wrote, never a broken call."""
        if self.mode == "forced":
            try:
                calls = parse_forced_tool_calls(text, self.choice)
            except ValueError:
                return text, [], finish_reason
            return None, calls, _tool_finish(finish_reason)
        if self.mode == "auto" and self.parser is not None:
            extracted = self.parser.extract_tool_calls(text)
            if extracted.tools_called:
                return extracted.content, extracted.tool_calls, _tool_finish(finish_reason)
        return text, [], finish_reason


def _tool_finish(finish_reason: str | None) -> str | None:
    return "tool_calls" if finish_reason == "stop" else finish_reason


def plan_tools(
    tools: list[ChatTool] | None, tool_choice: ToolChoice | None, parser: ToolParser | None, auto_enabled: bool
) -> ToolPlan:
    """vLLM's rules for tools and tool_choice; a 400 naming the field when they do not fit."""
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    for i, tool in enumerate(tool_dicts or []):
        # The template renders them with a recursive `tojson`, the grammar engine converts them.
        if too_deep(tool["function"].get("parameters")):
            raise APIError(400, f"The tool's parameters: {JSONTooDeepError()}", f"tools.{i}.function.parameters")
    choice: str | dict[str, Any] = (
        tool_choice.model_dump()
        if isinstance(tool_choice, NamedToolChoice)
        else tool_choice or ("auto" if tool_dicts else "none")
    )
    if choice == "none":
        return ToolPlan(tool_dicts, "none", choice)
    if not tool_dicts:
        raise APIError(400, 'tool_choice needs tools: set tools, or tool_choice "none"', "tool_choice")
    if choice == "auto":
        if not auto_enabled or parser is None:
            raise APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set on the server',
                "tool_choice",
            )
        return ToolPlan(tool_dicts, "auto", choice, parser.with_tools(tool_dicts))
    try:
        forced_tool_schema(tool_dicts, choice)
    except ValueError as e:
        raise APIError(400, str(e), "tool_choice") from e
    return ToolPlan(tool_dicts, "forced", choice)


def merge_structured(
    plan: ToolPlan, parallel: bool | None, requested: StructuredOutputsParams | None
) -> StructuredOutputsParams | None:
    forced = plan.structured_outputs(parallel)
    if forced is not None and requested is not None:
        raise SamplingParamError(
            "tool_choice",
            f"tool_choice {json.dumps(plan.choice)} cannot be combined with "
            f"{requested.source_field}: both constrain the output",
        )
    return forced or requested


def apply_tool_plan(plan: ToolPlan, parallel: bool | None, params: SamplingParams) -> None:
    """What a request's tools ask of its sampling: a forced call's grammar (merged with the
    request's own constraint, or a SamplingParamError naming both), and the special tokens kept in
    the text for a parser whose format is made of them (mistral's [TOOL_CALLS], gpt-oss's channels)."""
    params.structured_outputs = merge_structured(plan, parallel, params.structured_outputs)
    if plan.needs_special_tokens:
        params.skip_special_tokens = False


def tool_calls_json(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def delta_json(delta: DeltaMessage) -> dict[str, Any]:
    """A DeltaMessage as OpenAI's `delta` (content and/or tool_calls fragments)."""
    out: dict[str, Any] = {}
    if delta.content:
        out["content"] = delta.content
    calls = []
    for d in delta.tool_calls:
        call: dict[str, Any] = {"index": d.index}
        if d.id is not None:
            call["id"], call["type"] = d.id, "function"
        fn: dict[str, Any] = {}
        if d.name is not None:
            fn["name"] = d.name
        if d.arguments is not None or d.name is not None:
            fn["arguments"] = d.arguments or ""
        call["function"] = fn
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls carry `arguments` as JSON text; chat templates iterate them as objects
    (`tool_call.arguments | items`), so they get the parsed object, as vLLM does. Arguments nested
    too deep for the template's recursive `tojson` are a 400 naming them."""
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = loads_bounded(fn["arguments"])
                except JSONTooDeepError as e:
                    raise APIError(
                        400, f"The tool call's arguments: {e}", f"messages.{i}.tool_calls.{j}.function.arguments"
                    ) from None
                except ValueError:
                    pass  # not JSON: the template gets the text as the client sent it
    return messages
