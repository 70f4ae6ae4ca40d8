"""Fields a client may send that Tram does not honour yet: a 400 naming each, never a silent ignore.

The request models forbid unknown fields, so a misspelt or unknown field is a 400 too. The fields
listed here are known (OpenAI's or vLLM's) and only rejected when their value would change the
output: `tools: []`, `response_format: {"type": "text"}` or `tool_choice: "none"` ask for nothing
Tram does not do, and clients (LangChain, litellm) send such neutral values routinely.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticCustomError

from tram.sampling_params import SamplingParamError
from tram.sampling_params.json_scan import json_fault, json_members


def _is_none(v: Any) -> bool:
    return v is None


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}


def _text_only(v: Any) -> bool:
    return v is None or v == ["text"]


def _false(v: Any) -> bool:
    return v is None or v is False


def _zero(v: Any) -> bool:
    return v is None or v == 0


# field -> (is its value neutral?, why a non-neutral value is refused)
SHARED_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "guided_decoding_backend": (
        _is_none,
        "a per-request grammar engine is not supported: the server chooses it (--structured-outputs-backend)",
    ),
    "logits_processors": (_empty, "custom logits processors are not supported"),
    "priority": (_zero, "request priorities are not supported yet (the scheduler is first come, first served)"),
    "return_tokens_as_token_ids": (_false, "return_tokens_as_token_ids is not supported yet"),
    "request_id": (_is_none, "client-chosen request ids are not supported yet"),
}
CHAT_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **SHARED_RULES,
    "modalities": (_text_only, "only text output is supported"),
    "audio": (_is_none, "audio output is not supported"),
    "prediction": (_is_none, "predicted outputs are not supported yet"),
    "reasoning_effort": (_is_none, "reasoning_effort is not supported yet"),
    "web_search_options": (_is_none, "web search is not supported"),
    "documents": (_is_none, "documents for RAG chat templates are not supported yet"),
    "store": (_false, "storing completions is not supported"),
    "metadata": (_empty, "metadata is only kept for stored completions, which are not supported"),
    "echo": (_false, "echo is not supported on chat completions yet"),
    "use_beam_search": (
        _false,
        "beam search is not supported on chat completions yet (use /v1/completions or /generate)",
    ),
}
COMPLETION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = dict(SHARED_RULES)


def reject_unsupported(data: Any, rules: dict[str, tuple[Callable[[Any], bool], str]]) -> Any:
    """A `model_validator(mode="before")` body: refuse the first known-unsupported field whose value
    is not neutral; drop the neutral ones, which the model does not declare."""
    if not isinstance(data, dict):
        return data
    for name, (neutral, why) in rules.items():
        if name not in data:
            continue
        if not neutral(data[name]):
            raise PydanticCustomError("unsupported_field", "'{field}': {why}", {"field": name, "why": why})
        data = {k: v for k, v in data.items() if k != name}
    return data


def check_text(value: str) -> str:
    """Text must be valid Unicode: JSON allows a lone surrogate escape ("\\ud800"), which no
    tokenizer can encode and no response could echo back as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text contains a lone surrogate (U+{ord(value[e.start]):04X}) at index {e.start}; "
            "text must be valid Unicode"
        ) from None
    return value


def _members(item: Any) -> Iterable[tuple[Any, Any]]:
    """(key, value) of a JSON container's members, or of a request model's fields by their JSON names."""
    if isinstance(item, BaseModel):
        fields = [(f.alias or name, getattr(item, name)) for name, f in type(item).model_fields.items()]
        return fields + list((item.model_extra or {}).items())
    return json_members(item)


def check_constraint_text(model: BaseModel, names: tuple[str, ...], schemas: tuple[Any, ...] = ()) -> None:
    """SamplingParamError naming the field for a lone surrogate, or nesting or an integer the engine
    core cannot take, in a constraint (a regex, a choice, a structural tag...): the grammar engines
    and the engine core's msgpack take only UTF-8, and their codec errors name no field.

    `schemas` are values within those fields left out of this walk: StructuredOutputsParams walks a
    schema once for every fault and names the field too (a second walk: ~20 ms a 450 KB schema)."""
    skip = {id(schema) for schema in schemas}

    def members(item: Any) -> Iterable[tuple[Any, Any]]:
        return [(key, value) for key, value in _members(item) if id(value) not in skip]

    for name in names:
        value = getattr(model, name, None)
        fault = None if id(value) in skip else json_fault(value, members)
        if fault is not None:
            raise SamplingParamError(name, f"{name}: {fault}")
