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

LEGACY_FUNCTIONS = "the deprecated functions/function_call fields are not supported: use tools and tool_choice"


def _is_none(v: Any) -> bool:
    return v is None


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}


def _no_tool_choice(v: Any) -> bool:
    return v is None or v == "none"


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
    "functions": (_empty, LEGACY_FUNCTIONS),
    "function_call": (_no_tool_choice, LEGACY_FUNCTIONS),
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


def _surrogate_index(text: str) -> int | None:
    if text.isascii():  # O(1): most text never needs the encode below
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _members(item: Any) -> Iterable[tuple[Any, Any]]:
    """(key, value) of a JSON container's members, or of a request model's fields by their JSON names."""
    if isinstance(item, BaseModel):
        fields = [(f.alias or name, getattr(item, name)) for name, f in type(item).model_fields.items()]
        return fields + list((item.model_extra or {}).items())
    if isinstance(item, dict):
        return item.items()
    if isinstance(item, list):
        return enumerate(item)
    return ()


def _path(parents: list[tuple[int, str]], node: int, limit: int = 120) -> str:
    keys = []
    while node >= 0:
        node, key = parents[node]
        keys.append(key)
    path = ".".join(reversed(keys))
    return path if len(path) <= limit else path[: limit - 3] + "..."


def _describe(char: str, index: int | None, parents: list[tuple[int, str]], node: int) -> str:
    what = f"U+{ord(char):04X} at index {index}" if index is not None else f"U+{ord(char):04X} in a key"
    return what + (f" of '{_path(parents, node)}'" if node >= 0 else "")


def find_lone_surrogate(value: Any) -> str | None:
    """Where a lone surrogate is in a parsed JSON value (in a string or a key), in the client's
    words: "U+D800 at index 3 of 'properties.name.pattern'"; None if there is none. Iterative, and
    each container keeps only its parent, so a deeply nested value costs neither stack nor
    quadratic time, and numbers cost one type check each."""
    parents: list[tuple[int, str]] = []  # node -> (its parent node, its key)
    if isinstance(value, str):
        index = _surrogate_index(value)
        return None if index is None else _describe(value[index], index, parents, -1)
    pending: list[tuple[int, Any]] = [(-1, value)]
    while pending:
        node, item = pending.pop()
        for key, child in _members(item):
            if isinstance(key, str) and (index := _surrogate_index(key)) is not None:
                return _describe(key[index], None, parents, node)
            if isinstance(child, str):
                if (index := _surrogate_index(child)) is not None:
                    parents.append((node, str(key)))
                    return _describe(child[index], index, parents, len(parents) - 1)
            elif isinstance(child, (dict, list, BaseModel)):
                parents.append((node, str(key)))
                pending.append((len(parents) - 1, child))
    return None


def check_constraint_text(model: BaseModel, names: tuple[str, ...]) -> None:
    """SamplingParamError naming the field for a lone surrogate in a constraint (a regex, a choice, a
    schema...): the grammar engines and the engine core's msgpack take only UTF-8, and their codec
    error names no field."""
    for name in names:
        where = find_lone_surrogate(getattr(model, name, None))
        if where is not None:
            raise SamplingParamError(name, f"{name} contains a lone surrogate ({where}); text must be valid Unicode")
