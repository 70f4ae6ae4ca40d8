"""The request bodies of Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`).

Fields and rules are Anthropic's: `max_tokens` is required, `temperature` is at most 1, content
blocks are told apart by `type` (text, tool_use, tool_result, and an earlier answer's thinking; any
other is a 400 naming the block), unknown fields are refused. Rules across messages (a tool_result
answers an earlier tool_use, tool blocks in their role's messages) are checked here too, so that a
bad conversation is a 400 naming its block before anything is rendered. `to_chat()` says the same
conversation in the chat endpoint's words, which renders, samples and parses tool calls for this
API as for its own.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tram.sampling_params import SAMPLING_RANGES as RANGES
from tram.sampling_params.json_scan import json_fault
from tram.server.protocol.openai import Text

# Anthropic's pattern for tool names, with chat's length cap (the chat machinery takes them on).
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
TOOL_USE_ID = r"^[a-zA-Z0-9_-]+$"
_MAX_TEMPERATURE = 1.0  # Anthropic's range is [0, 1]


def field_error(field: str, why: str) -> PydanticCustomError:
    """A validation error whose message begins with the field it blames, as Anthropic's do."""
    return PydanticCustomError("unsupported_field", "{field}: {why}", {"field": field, "why": why})


def _checked_json(value: dict[str, Any]) -> dict[str, Any]:
    """What the engine and the chat template cannot take (nesting, 64-bit integers, lone
    surrogates) is the client's error, named here."""
    fault = json_fault(value)
    if fault is not None:
        raise ValueError(fault)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(_Strict):
    """Accepted and changes nothing: Tram's prefix cache reuses every shared prefix by itself."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl | None = None
    # What a client's SDK sends back with an earlier answer's text block; only an empty list is
    # meaningful without documents to cite.
    citations: list[Any] | None = Field(default=None, max_length=0)


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(pattern=TOOL_USE_ID)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any]
    cache_control: CacheControl | None = None

    @field_validator("input")
    @classmethod
    def _input_json(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _checked_json(v)


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(pattern=TOOL_USE_ID)
    content: Text | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(block.text for block in self.content)


class ThinkingBlock(_Strict):
    """An earlier answer's thinking, sent back in its assistant message. Its signature is whatever
    the server that wrote it signed it with: kept by the client, checked by nobody here."""

    type: Literal["thinking"]
    thinking: Text
    signature: str


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[ContentBlock], Field(min_length=1)]


class Tool(_Strict):
    """A client tool. Anthropic's server tools (web search, code execution...) have a versioned
    `type` and no input_schema; they are refused by name."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: Text | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tool(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(f"tools of type {kind!r} (Anthropic's server tools) are not supported; only client tools")
        return data

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type", "object") != "object":
            raise ValueError(f"input_schema must have type 'object', got {v.get('type')!r}")
        return _checked_json({"type": "object", **v})


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            why = "required with type 'tool'" if self.type == "tool" else f"not allowed with type {self.type!r}"
            raise field_error("tool_choice.name", why)
        if self.type == "none" and self.disable_parallel_tool_use is not None:
            raise field_error("tool_choice.disable_parallel_tool_use", "not allowed with type 'none'")
        return self


class Thinking(_Strict):
    """Whether the model thinks: the chat template's `enable_thinking` switch. A model thinks only
    on a server with a --reasoning-parser (the handler refuses it otherwise); `budget_tokens` is
    accepted and not enforced (the thinking counts against max_tokens)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)


class OutputFormat(_Strict):
    """Structured outputs: the answer is JSON that `schema` accepts (chat's json_schema format)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    @field_validator("schema_")
    @classmethod
    def _schema_json(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _checked_json(v)


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None

    @field_validator("effort")
    @classmethod
    def _no_effort(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("an effort level is not supported yet (it steers extended thinking)")
        return v


class Metadata(_Strict):
    user_id: Text | None = None  # an end user's id, for abuse monitoring: nothing for an engine to do


class CountTokensRequest(_Strict):
    """`POST /v1/messages/count_tokens`: what a conversation costs as a prompt."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: Text | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None  # the format adds nothing to the prompt here

    @model_validator(mode="after")
    def _conversation_rules(self) -> CountTokensRequest:
        _check_tools(self.tools or [], self.tool_choice)
        _check_blocks(self.messages)
        return self

    @property
    def prefill(self) -> bool:
        """A final assistant message is the start of the answer, which the model continues."""
        return self.messages[-1].role == "assistant"

    def to_chat(self) -> dict[str, Any]:
        """The chat request's fields for this conversation (messages, tools, tool_choice, ...)."""
        choice = self.tool_choice
        return {
            "model": self.model,
            "messages": _chat_messages(self.system, self.messages),
            "tools": [_chat_tool(t) for t in self.tools] if self.tools else None,
            "tool_choice": _chat_tool_choice(choice, bool(self.tools)),
            "parallel_tool_calls": False if choice is not None and choice.disable_parallel_tool_use else None,
            "add_generation_prompt": not self.prefill,
            "continue_final_message": self.prefill,
            "chat_template_kwargs": None
            if self.thinking is None
            else {"enable_thinking": self.thinking.type != "disabled"},
        }


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(**RANGES["max_tokens"].bounds())
    stop_sequences: list[Text] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, **RANGES["temperature"].bounds(high=_MAX_TEMPERATURE))
    top_p: float | None = Field(default=None, **RANGES["top_p"].bounds())
    top_k: int | None = Field(default=None, **RANGES["top_k"].bounds(low=0))  # Anthropic's: 0 or more
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: either is it

    def to_chat(self) -> dict[str, Any]:
        return {
            **super().to_chat(),
            "max_tokens": self.max_tokens,
            "stop": self.stop_sequences,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stream": self.stream,
            "response_format": self._response_format(),
        }

    def _response_format(self) -> dict[str, Any] | None:
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is None:
            return None
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}


def _check_tools(tools: list[Tool], choice: ToolChoice | None) -> None:
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in names:
            raise field_error(f"tools.{i}.name", f"tool names must be unique; {tool.name!r} is given twice")
        names.add(tool.name)
    if choice is None:
        return
    if choice.type in ("any", "tool") and not tools:
        raise field_error("tool_choice", f"tool_choice type {choice.type!r} needs tools")
    if choice.type == "tool" and choice.name not in names:
        raise field_error("tool_choice.name", f"{choice.name!r} is not among the tools")


def _check_blocks(messages: list[InputMessage]) -> None:
    """tool_use and thinking blocks only in assistant messages, each tool_use id once; tool_result
    blocks only in user messages, each answering a tool_use of an earlier message; no tool_use left
    for a prefill."""
    asked: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, ToolUseBlock):
                if message.role != "assistant":
                    raise field_error(where, "tool_use blocks belong in assistant messages")
                if block.id in asked:
                    raise field_error(f"{where}.id", f"tool_use ids must be unique; {block.id!r} is used twice")
                if i == len(messages) - 1:
                    raise field_error(where, "the final assistant message cannot hold a tool_use without its result")
                asked.add(block.id)
            elif isinstance(block, ThinkingBlock) and message.role != "assistant":
                raise field_error(where, "thinking blocks belong in assistant messages")
            elif isinstance(block, ToolResultBlock):
                if message.role != "user":
                    raise field_error(where, "tool_result blocks belong in user messages")
                if block.tool_use_id not in asked:
                    raise field_error(
                        f"{where}.tool_use_id",
                        f"{block.tool_use_id!r} answers no tool_use block of an earlier message",
                    )


def _system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    return "\n".join(block.text for block in system)  # as chat joins text parts


def _chat_messages(system: str | list[TextBlock] | None, messages: list[InputMessage]) -> list[dict[str, Any]]:
    """Chat's messages: a system message first; an assistant's tool_use blocks as its tool_calls;
    each tool_result as a `tool` message (named after the call it answers), in block order."""
    names = {
        block.id: block.name
        for m in messages
        if not isinstance(m.content, str)
        for block in m.content
        if isinstance(block, ToolUseBlock)
    }
    system_text = _system_text(system)
    out: list[dict[str, Any]] = [] if system_text is None else [{"role": "system", "content": system_text}]
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            out.append(_assistant_message(m.content))
        else:
            out.extend(_user_messages(m.content, names))
    return out


def _assistant_message(blocks: list[Any]) -> dict[str, Any]:
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    thoughts = [b.thinking for b in blocks if isinstance(b, ThinkingBlock)]
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if thoughts:  # chat's name for it, which templates that show earlier thinking read
        message["reasoning_content"] = "\n".join(thoughts)
    return {**message, "tool_calls": calls} if calls else message


def _user_messages(blocks: list[Any], names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
            continue
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        result = {"role": "tool", "tool_call_id": block.tool_use_id, "name": names[block.tool_use_id]}
        # `is_error` is kept for templates that read it; the result's own text says what failed.
        out.append({**result, "content": block.text(), **({"is_error": True} if block.is_error else {})})
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _chat_tool(tool: Tool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: ToolChoice | None, has_tools: bool) -> str | dict[str, Any] | None:
    """Anthropic's choice as chat's: any -> "required", a named tool -> a named function, auto
    without tools -> "none" (there is nothing to call); None leaves chat's default."""
    if choice is None:
        return None
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    if choice.type == "auto" and not has_tools:
        return "none"
    return {"any": "required"}.get(choice.type, choice.type)
