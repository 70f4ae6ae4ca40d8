"""The body of vLLM's legacy POST /generate: a prompt, `stream`, beam search switches, and any
`SamplingParams` field by its own name.

The sampling fields are derived from `SamplingParams` itself, so a new sampling feature reaches
/generate without being declared twice; their values are validated there (a bad one is a 400 naming
the field). Unknown fields are refused.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, create_model

from tram.sampling_params import SamplingParams
from tram.server.protocol.openai import Text
from tram.server.protocol.structured import StructuredOutputsField

# Set by the server, not the client: /generate streams cumulative texts or answers once.
_SERVER_FIELDS = {"output_kind"}


class GenerateBase(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: Text = Field(min_length=1)
    model: str | None = None
    stream: bool = False
    use_beam_search: bool = False
    length_penalty: float = Field(default=1.0, allow_inf_nan=False)

    def sampling_kwargs(self) -> dict[str, Any]:
        """The SamplingParams fields the client set."""
        names = set(type(self).model_fields) - set(GenerateBase.model_fields)
        kwargs = {k: getattr(self, k) for k in names if k in self.model_fields_set}
        so = kwargs.get("structured_outputs")
        if isinstance(so, StructuredOutputsField):
            kwargs["structured_outputs"] = so.model_dump(exclude_defaults=True, by_alias=True)
        return kwargs


def _sampling_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(SamplingParams)
    fields: dict[str, Any] = {}
    for f in msgspec.structs.fields(SamplingParams):
        if f.name not in _SERVER_FIELDS:
            default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
            # msgspec structs are not pydantic types: a field holding one gets its pydantic twin.
            hint = StructuredOutputsField | None if f.name == "structured_outputs" else hints[f.name]
            fields[f.name] = (hint, default)
    return fields


GenerateRequest = create_model("GenerateRequest", __base__=GenerateBase, **_sampling_fields())
