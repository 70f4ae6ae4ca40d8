"""What the structured-output server tests share: requests, bounded schemas, and helpers that
validate outputs and put streamed ones together.

stories260K cannot write JSON by itself: only the grammar makes these outputs valid. It loves
whitespace and never ends a JSON text of its own accord, so the servers run with
--structured-outputs-disable-any-whitespace and every schema is bounded (maxLength, enums, integer
ranges, maxItems, no additional properties).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
from conftest import STORIES

MESSAGES = [{"role": "user", "content": "Tell me a story"}]
PROMPT = "Once upon a time"
SEEDED = {"temperature": 0.8, "seed": 1234}


def closed_object(**properties: dict) -> dict:
    """The schema of an object with exactly these properties, all of them required."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


PERSON = closed_object(
    name={"type": "string", "maxLength": 12},
    age={"type": "integer", "minimum": 0, "maximum": 99},
    pet={"enum": ["cat", "dog", "fish"]},
)
SHOPPING = closed_object(
    items={"type": "array", "items": {"enum": ["milk", "eggs", "bread"]}, "minItems": 1, "maxItems": 3},
    paid={"type": "boolean"},
)
REGEX = r"[a-z]{3}-[0-9]{2}"


def json_schema_format(schema: dict, name: str = "out") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def valid(text: str | None, schema: dict) -> Any:
    assert text is not None
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def chat(client: openai.OpenAI, **kw) -> Any:
    return client.chat.completions.create(model=STORIES, messages=kw.pop("messages", MESSAGES), **kw)


def stream_chat(client: openai.OpenAI, **kw) -> tuple[str, str | None]:
    """(the concatenated content deltas, the final finish_reason) of a streamed chat choice 0."""
    text, finish = "", None
    for chunk in chat(client, stream=True, **kw):
        for c in chunk.choices:
            assert c.index == 0
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


def stream_completion(client: openai.OpenAI, **kw) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.completions.create(model=STORIES, stream=True, **kw):
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def json_schema_round(client: openai.OpenAI, schema: dict, **sampling) -> str:
    """A chat constrained by `schema` (response_format): its output validates and ends with "stop",
    and streamed it is the same text (same sampling); the text."""
    kw = {"response_format": json_schema_format(schema), "max_tokens": 100, **sampling}
    whole = chat(client, **kw).choices[0]
    assert whole.finish_reason == "stop", whole
    valid(whole.message.content, schema)
    assert stream_chat(client, **kw) == (whole.message.content, "stop")
    return whole.message.content
