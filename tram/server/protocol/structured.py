"""The request fields that constrain the output, in every spelling clients send, turned into one
`StructuredOutputsParams`: OpenAI's `response_format`, vLLM's `structured_outputs` object and its
older `guided_*` fields. A request may use one of them; each error names the field at fault.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, create_model

from tram.sampling_params import SamplingParamError, StructuredOutputsParams
from tram.server.protocol.field_rules import check_constraint_text


def _mirrored_fields() -> dict[str, Any]:
    """StructuredOutputsParams' fields, so a new option reaches the request body without being
    declared twice (`json` is spelt `json_` here: BaseModel has a `json` method)."""
    hints = typing.get_type_hints(StructuredOutputsParams)
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(StructuredOutputsParams):
        if f.name not in _INTERNAL:
            fields[f"{f.name}_" if f.name == "json" else f.name] = (
                hints[f.name],
                Field(default=f.default, alias=f.name),
            )
    return fields


_INTERNAL = {"source_field"}  # set by the server, not the client
# vLLM's `structured_outputs` request object: exactly one constraint, the rest options.
StructuredOutputsField = create_model(
    "StructuredOutputsField", __config__=ConfigDict(extra="forbid", populate_by_name=True), **_mirrored_fields()
)


class JsonSchemaSpec(BaseModel):
    """OpenAI's `response_format.json_schema`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: text, json_object or json_schema; vLLM's structural_tag too
    (its whole body goes to the grammar engine)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaSpec | None = None


# The request fields that carry a constraint's text.
_CONSTRAINT_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
)


def _set_fields(model: BaseModel) -> dict[str, Any]:
    """A model's fields that differ from their defaults, by their JSON names: `model_dump` would
    copy a schema of hundreds of KB node by node."""
    return {
        f.alias or name: value
        for name, f in type(model).model_fields.items()
        if (value := getattr(model, name)) != f.default
    }


class StructuredFields(BaseModel):
    """Mixed into the completion and chat request models."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None  # type: ignore[valid-type]
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    def structured_params(self) -> StructuredOutputsParams | None:
        """The one constraint this request asks for (None: free text). ValueError naming the field
        for two at once or a malformed one; whether it compiles is the engine core's call."""
        # Before anything reads or encodes the text; also the depth check a structural tag's dump needs.
        check_constraint_text(self, _CONSTRAINT_FIELDS, self._schemas())
        sources = self._sources()
        if len(sources) > 1:
            raise SamplingParamError(
                sources[1][0],
                f"only one output constraint may be given; got {' and '.join(name for name, _ in sources)}",
            )
        if not sources:
            return None
        field, kwargs = sources[0]
        return StructuredOutputsParams(**kwargs, source_field=field)

    def _schemas(self) -> tuple[Any, ...]:
        """The JSON schemas given as objects: StructuredOutputsParams checks each itself."""
        so, rf = self.structured_outputs, self.response_format
        candidates = (
            self.guided_json,
            so.json_ if so is not None else None,
            rf.json_schema.schema_ if rf is not None and rf.json_schema is not None else None,
        )
        return tuple(c for c in candidates if isinstance(c, dict))

    def _sources(self) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        if self.structured_outputs is not None:
            so = _set_fields(self.structured_outputs)
            out.append(("structured_outputs", so))
        guided = {
            "json": self.guided_json,
            "regex": self.guided_regex,
            "choice": self.guided_choice,
            "grammar": self.guided_grammar,
        }
        for kind, value in guided.items():
            if value is not None:
                extra = {"whitespace_pattern": self.guided_whitespace_pattern} if self.guided_whitespace_pattern else {}
                out.append((f"guided_{kind}", {kind: value, **extra}))
        rf = self._response_format()
        if rf is not None:
            out.append(("response_format", rf))
        return out

    def _response_format(self) -> dict[str, Any] | None:
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return {"json_object": True}
        if rf.type == "structural_tag":
            return {"structural_tag": json.dumps(rf.model_dump(exclude_none=True))}
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise SamplingParamError("response_format", "response_format of type json_schema needs json_schema.schema")
        return {"json": rf.json_schema.schema_}
