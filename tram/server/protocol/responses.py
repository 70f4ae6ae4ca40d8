"""The request body of OpenAI's Responses API (`POST /v1/responses`): text and function calls.

What this server cannot do yet (built-in tools, reasoning, stored responses, ...) is a
400 that names the field, never a setting quietly ignored: fields nobody knows fail pydantic's
`extra="forbid"`, and the known-but-unsupported ones are accepted only at the value that means
"off" (`ResponsesRequest.unsupported()` says which one is not).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tram.sampling_params import SAMPLING_RANGES as RANGES
from tram.sampling_params.json_scan import json_fault
from tram.server.protocol.field_rules import check_text
from tram.server.protocol.openai import ChatMessage, SamplingFields, Text
from tram.server.protocol.responses_tools import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    append_call,
    chat_tool_choice,
    parse_tool_choice,
    parse_tools,
    unknown_call_id,
)
from tram.server.protocol.structured import ResponseFormat
from tram.server.tools.chat import ChatTool, ToolChoice

# OpenAI's cap on temperature in the Responses API (chat and completions take any finite one).
_MAX_TEMPERATURE = 2.0
# OpenAI's limits on `metadata`.
_MAX_METADATA_PAIRS, _MAX_METADATA_KEY, _MAX_METADATA_VALUE = 16, 64, 512

# Known fields accepted only at these values (what the field's absence means); anything else is a
# 400 naming the field, with the reason after it.
_OFF_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "max_tool_calls": ((None,), "to allow one call, send parallel_tool_calls=false"),
    "previous_response_id": (
        (None,),
        "this server stores no responses to continue; send the whole conversation in 'input'",
    ),
    "conversation": ((None,), "this server stores no conversations; send the whole conversation in 'input'"),
    "store": ((None, False), "this server stores no responses; send store=false"),
    "background": ((None, False), "background responses need a response store"),
    "reasoning": ((None,), "no reasoning settings"),
    "include": ((None, []), "no extra output data"),
    "top_logprobs": ((None, 0), "no logprobs on /v1/responses"),
    "truncation": ((None, "disabled"), "only truncation='disabled'"),
    "prompt": ((None,), "no stored prompt templates"),
    "stream_options": ((None,), "no stream options"),
    "service_tier": ((None, "auto", "default"), "this server has one service tier"),
}
_FORMATS = ("text", "json_object", "json_schema")  # text.format types (structured outputs)
_SCHEMA_FIELDS = ("name", "description", "schema", "strict")  # json_schema's, flat in text.format


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputTextPart(BaseModel):
    """A text part of a message's content. `annotations` and `logprobs` come along when a client
    sends an earlier response's output back as input; they describe that output and do not change
    what the model sees."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputMessage(BaseModel):
    """A message item of `input`. `id` and `status` come along with an earlier response's output
    item sent back as input; they name that item and do not change what the model sees."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart]
    id: str | None = None
    status: str | None = None

    def to_chat(self) -> ChatMessage:
        """Parts joined by newlines, as the chat endpoint joins text parts, so that the same
        conversation renders to the same prompt through either endpoint."""
        text = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)
        return ChatMessage(role=self.role, content=text)


def _check_item_text(where: str, message: InputMessage) -> None:
    """A lone surrogate in a message's text is the client's error, named here: the tokenizer's codec
    error names nothing. (Not a validator of the content's union: that would report both branches.)"""
    if isinstance(message.content, str):
        texts = [(f"{where}.content", message.content)]
    else:
        texts = [(f"{where}.content[{j}].text", part.text) for j, part in enumerate(message.content)]
    for at, text in texts:
        try:
            check_text(text)
        except ValueError as e:
            raise ValueError(f"{at}: {e}") from None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem
_ITEM_MODELS: dict[str, type[FunctionCallItem | FunctionCallOutputItem]] = {
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
}


def _validated(where: str, model: type[BaseModel], item: dict[str, Any]) -> Any:
    try:
        return model.model_validate(item)
    except ValidationError as e:
        first = e.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise ValueError(f"{where}{loc}: {first['msg']}") from None


def _parse_item(index: int, item: Any) -> InputItem:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be a message object, got {type(item).__name__}")
    kind = item.get("type", "message")
    if kind in _ITEM_MODELS:
        return _validated(where, _ITEM_MODELS[kind], item)
    if kind != "message":
        raise ValueError(
            f"{where}: items of type {kind!r} are not supported yet; only messages, "
            "function_call and function_call_output"
        )
    content = item.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type not in ("input_text", "output_text"):
                raise ValueError(
                    f"{where}.content[{j}]: content of type {part_type!r} is not supported "
                    "yet; only input_text and output_text"
                )
    message = _validated(where, InputMessage, item)
    _check_item_text(where, message)
    return message


class TextFormat(BaseModel):
    """`text.format`: text, json_object, or json_schema with its name, schema, description and
    strict in the format object itself (chat's response_format nests them under `json_schema`).
    Each mistake is a 400 naming `text.format.<field>`. Other types are named by `unsupported()`."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    type: str
    name: str | None = Field(default=None, min_length=1, max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema_text(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        fault = json_fault(v)  # the one walk of this schema: what the engine core cannot take
        if fault is not None:
            raise ValueError(f"the schema: {fault}")
        return v

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> TextFormat:
        if self.type not in _FORMATS:
            return self
        takes = _SCHEMA_FIELDS if self.type == "json_schema" else ()
        given = [k for k in _SCHEMA_FIELDS if getattr(self, "schema_" if k == "schema" else k) is not None]
        for key in [k for k in given if k not in takes] + list(self.model_extra or {}):
            why = f"text.format of type {self.type!r} takes only {', '.join(('type',) + takes)}"
            raise PydanticCustomError(
                "unsupported_field", "'{field}': {why}", {"field": f"text.format.{key}", "why": why}
            )
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            missing = "name" if self.name is None else "schema"
            raise PydanticCustomError(
                "unsupported_field",
                "'{field}': text.format of type json_schema needs a name and a schema",
                {"field": f"text.format.{missing}"},
            )
        return self


class TextSettings(BaseModel):
    """`text`: its `format`; anything else in it is named by `unsupported()`."""

    model_config = ConfigDict(extra="allow", strict=True)

    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`. Supported: `input` (a string, a user message, or a list of messages),
    `instructions` (a system message before them), `model`, `max_output_tokens`, `temperature`,
    `top_p`, `stream`, `user` and `metadata` (echoed back), `text.format` as text, json_object or
    json_schema (structured outputs), function `tools` with `tool_choice` and `parallel_tool_calls`
    (as chat's), and `function_call` / `function_call_output` items carrying calls and their results."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    input: str | list[Any]
    instructions: Text | None = None
    max_output_tokens: int | None = Field(default=None, **RANGES["max_tokens"].bounds())
    temperature: float | None = Field(default=None, **RANGES["temperature"].bounds(high=_MAX_TEMPERATURE))
    top_p: float | None = Field(default=None, **RANGES["top_p"].bounds())
    stream: bool = False
    user: Text | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool = True
    text: TextSettings | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Accepted only when off (see _OFF_VALUES).
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    store: bool | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    prompt: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    service_tier: str | None = None

    @field_validator("input")
    @classmethod
    def _parse_input(cls, v: str | list[Any]) -> str | list[InputItem]:
        # Parsed by hand rather than as a union of item models: pydantic's error for a union names
        # every branch, while a client needs to hear "input[2]: function_call is not supported".
        if isinstance(v, str):
            if not v:
                raise ValueError("input must not be empty")
            return check_text(v)
        if not v:
            raise ValueError("input must not be an empty list")
        return [_parse_item(i, item) for i, item in enumerate(v)]

    @field_validator("tools")
    @classmethod
    def _parse_tools(cls, v: list[Any] | None) -> list[FunctionTool] | None:
        return None if v is None else parse_tools(v)

    @field_validator("tool_choice")
    @classmethod
    def _parse_tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        return None if v is None else parse_tool_choice(v)

    @model_validator(mode="after")
    def _results_answer_calls(self) -> ResponsesRequest:
        unknown = None if isinstance(self.input, str) else unknown_call_id(self.input)
        if unknown is not None:
            i, call_id = unknown
            why = (
                f"input[{i}].call_id: this function_call_output answers call_id {_short(call_id)}, which no "
                "function_call item before it in input has"
            )
            # (A model validator's error has no location of its own: name the field.)
            raise PydanticCustomError("unsupported_field", "{why}", {"field": "input", "why": why})
        return self

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > _MAX_METADATA_PAIRS:
            raise ValueError(f"metadata holds at most {_MAX_METADATA_PAIRS} pairs, got {len(v)}")
        for key, value in v.items():
            check_text(key)  # echoed in the response, which is UTF-8
            check_text(value)
            if len(key) > _MAX_METADATA_KEY or len(value) > _MAX_METADATA_VALUE:
                raise ValueError(
                    f"metadata keys are at most {_MAX_METADATA_KEY} characters and values at "
                    f"most {_MAX_METADATA_VALUE} (key {key[:_MAX_METADATA_KEY]!r})"
                )
        return v

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field set to something this server cannot do, or None."""
        for name, (off, why) in _OFF_VALUES.items():
            value = getattr(self, name)
            # `x in off` would take False for 0 and True for 1; compare types too.
            if not any(value == o and type(value) is type(o) for o in off):
                return name, f"'{name}'={_short(value)} is not supported yet ({why})"
        text = self.text
        if text is not None and text.format is not None and text.format.type not in _FORMATS:
            return (
                "text.format",
                f"text.format of type {text.format.type!r} is not supported; only {', '.join(_FORMATS)}",
            )
        if text is not None and text.model_extra:
            return "text", f"'text' with {_short(text.model_extra)} is not supported yet (only text.format)"
        return None

    def response_format(self) -> ResponseFormat | None:
        """`text.format` as chat's `response_format` (the Responses API flattens json_schema's
        name/schema/strict into the format object)."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_schema":
            values = (fmt.name, fmt.description, fmt.schema_, fmt.strict)  # not a dump: a schema may nest deep
            spec = {k: v for k, v in zip(_SCHEMA_FIELDS, values) if v is not None}
            return ResponseFormat.model_validate({"type": "json_schema", "json_schema": spec})
        return ResponseFormat.model_validate({"type": fmt.type})

    def messages(self) -> list[ChatMessage]:
        """The conversation for the chat template: `instructions` as a system message first, calls
        as assistant `tool_calls`, their results as `tool` messages (chat's shapes for both)."""
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        messages = [ChatMessage(role="system", content=self.instructions)] if self.instructions is not None else []
        for item in items:
            if isinstance(item, FunctionCallItem):
                append_call(messages, item)
            else:
                messages.append(item.to_chat())
        return messages

    def chat_tools(self) -> list[ChatTool] | None:
        return None if self.tools is None else [t.to_chat() for t in self.tools]

    def chat_tool_choice(self) -> ToolChoice | None:
        return chat_tool_choice(self.tool_choice)

    def sampling_fields(self) -> SamplingFields:
        """The chat endpoint's sampling fields for this request, so that defaults (the model's
        generation config) and the output kind (DELTA when streaming) are chosen in one place."""
        return SamplingFields(
            model=self.model,
            temperature=self.temperature,
            top_p=self.top_p,
            stream=self.stream,
            user=self.user,
            response_format=self.response_format(),
        )
