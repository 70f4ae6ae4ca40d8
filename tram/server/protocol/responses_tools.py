"""Function calling in the Responses API's words, and its translation to chat's.

The Responses API spells tools flat (`{"type": "function", "name", "parameters", ...}`) where chat
nests them under `function`, names a forced function as `{"type": "function", "name": ...}`, and
carries a conversation's calls and their results as `function_call` and `function_call_output`
items of `input` rather than as assistant `tool_calls` and `tool` messages. Everything here maps
those onto chat's shapes, so that tools/chat.py plans tools for both endpoints alike.

Built-in tools (web_search, file_search, computer use, MCP, ...) are OpenAI's own services: a 400
naming the tool, never a tool list quietly cut short.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from tram.server.protocol.openai import ChatMessage, Text
from tram.server.tools.chat import ChatTool, NamedToolChoice, ToolChoice

_CHOICE_WORDS = ("none", "auto", "required")


def _unsupported(field: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_field", "'{field}': {why}", {"field": field, "why": why})


class FunctionTool(BaseModel):
    """A function tool as the Responses API spells it: flat, no `function` object."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_chat(self) -> ChatTool:
        return ChatTool.model_validate({"type": "function", "function": self.model_dump(exclude={"type"})})


def parse_tools(tools: list[Any]) -> list[FunctionTool]:
    """`tools`: function tools only; each mistake a 400 naming `tools.<i>...`."""
    parsed = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            why = (
                f"tools of type {kind!r} are not supported; only function tools"
                if isinstance(kind, str)
                else "a tool must be an object with a 'type'; only function tools are supported"
            )
            raise _unsupported(f"tools.{i}.type" if isinstance(tool, dict) else f"tools.{i}", why)
        if "function" in tool:  # chat's nested shape, sent here
            why = "the Responses API spells a function tool flat: name, description, parameters, strict beside type"
            raise _unsupported(f"tools.{i}.function", why)
        try:
            parsed.append(FunctionTool.model_validate(tool))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in (f"tools.{i}", *first["loc"]))
            raise _unsupported(where, first["msg"]) from None
    return parsed


def parse_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """`tool_choice`: "none", "auto", "required", or `{"type": "function", "name": ...}`."""
    if isinstance(choice, str):
        if choice not in _CHOICE_WORDS:
            raise _unsupported("tool_choice", f"{choice!r} is not one of {', '.join(_CHOICE_WORDS)}")
        return choice
    kind = choice.get("type")
    if kind != "function":
        raise _unsupported(
            "tool_choice", f"a tool_choice of type {kind!r} is not supported; only function (or none, auto, required)"
        )
    extra = set(choice) - {"type", "name"}
    if not isinstance(choice.get("name"), str) or extra:
        why = f"unknown keys {sorted(extra)}" if extra else "a function choice needs the function's 'name'"
        raise _unsupported("tool_choice", why)
    return choice


def chat_tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    """The Responses tool_choice in chat's shape (a named function nests under `function`)."""
    if isinstance(choice, dict):
        return NamedToolChoice.model_validate({"type": "function", "function": {"name": choice["name"]}})
    return choice  # type: ignore[return-value]  # one of _CHOICE_WORDS, or None


class OutputTextPart(BaseModel):
    """A text part of a function call's output (the API also takes images and files: refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["input_text", "output_text"]
    text: Text


class FunctionCallItem(BaseModel):
    """An input item: a call the model made earlier (as the API returned it, sent back)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: Text
    arguments: Text
    id: str | None = None
    status: str | None = None

    def tool_call(self) -> dict[str, Any]:
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class FunctionCallOutputItem(BaseModel):
    """An input item: what the client's function returned for the call `call_id`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Text | list[OutputTextPart]
    id: str | None = None
    status: str | None = None
    name: str | None = None

    def to_chat(self) -> ChatMessage:
        """A `tool` message; text parts joined by newlines, as message parts are."""
        text = self.output if isinstance(self.output, str) else "\n".join(p.text for p in self.output)
        return ChatMessage(role="tool", content=text, tool_call_id=self.call_id)


def unknown_call_id(items: list[Any]) -> tuple[int, str] | None:
    """(index, call_id) of the first function_call_output whose call no earlier function_call
    item made: its result would reach the template answering nothing the model asked."""
    made: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            made.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in made:
            return i, item.call_id
    return None


def append_call(messages: list[ChatMessage], item: FunctionCallItem) -> None:
    """Calls one after another are one assistant turn, as chat writes parallel calls: they join the
    assistant message before them (its text, or the calls already there) rather than each opening a
    message of its own, which a template would render as separate turns."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        extra = last.model_extra if last.model_extra is not None else {}
        calls = extra.get("tool_calls")
        if calls is not None or last.content:
            extra["tool_calls"] = [*(calls or []), item.tool_call()]
            return
    messages.append(ChatMessage(role="assistant", content=None, tool_calls=[item.tool_call()]))
