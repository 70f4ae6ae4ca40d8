"""What a request asks its output to match: vLLM's `StructuredOutputsParams`, shape for shape.

Torch-free and free of any grammar engine: the API process builds and checks these, and they cross
to the engine core inside `SamplingParams`, so they sit beside it (a leaf, below the server and
tram/structured_output/). Whether a schema, regex or grammar is *valid* is the grammar engine's call,
made in the engine core off the step loop (tram/structured_output/manager.py).
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

import msgspec

from tram.sampling_params.checks import SamplingParamError
from tram.sampling_params.client_json import JSONTooDeepError, loads_bounded
from tram.sampling_params.json_scan import json_fault
from tram.sampling_params.short_repr import short_repr

# The constraint fields: exactly one is set.
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
REPR_CHARS = 300
# True while the engine core decodes a request that the API process built, and so checked, already:
# the checks of a schema below (a parse, a walk of every node: ~20-40 ms for a 400 KB schema) are not
# run again on the engine core's step loop (engine/messages.py sets it).
CHECKED_UPSTREAM: ContextVar[bool] = ContextVar("structured_outputs_checked_upstream", default=False)


def _parse(text: str, field: str, what: str) -> Any:
    """A constraint's JSON text, parsed; a 400 naming `field` for text that is not JSON or nests too
    deep for the readers after this one (the engine parses it again, as do the grammar engines)."""
    try:
        return loads_bounded(text)
    except ValueError as e:
        reason = str(e) if isinstance(e, JSONTooDeepError) else f"it is not valid JSON: {e}"
        raise SamplingParamError(field, f"{what} in {field}: {reason}") from None


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Exactly one of `json` (a JSON schema, as a dict or its text), `regex`, `choice` (the output is
    one of these strings), `grammar` (EBNF / GBNF), `json_object` (any JSON object) or
    `structural_tag` (xgrammar's structural tag, as JSON text).

    `disable_any_whitespace` compiles JSON without optional whitespace (a small model otherwise can
    wander in spaces and newlines until max_tokens). `source_field` names the request field that
    asked for the constraint ("response_format", "guided_json", "tool_choice", ...) so an error
    can name it; it is Tram's, not vLLM's.

    `reasoning_end` (Tram's, set by the server's reasoning parser) holds the token ids that end a
    thinking model's thinking: the constraint applies only to the tokens after them. It is not part
    of the grammar, so not of its cache key.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    disable_fallback: bool = False
    source_field: str | None = None
    reasoning_end: list[int] | None = None

    def __post_init__(self) -> None:
        field = self.source_field or "structured_outputs"
        chosen = [name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)]
        if len(chosen) != 1:
            raise SamplingParamError(
                field,
                "structured outputs need exactly one of json, regex, choice, grammar, json_object or "
                f"structural_tag; got {', '.join(chosen) if chosen else 'none'}",
            )
        if CHECKED_UPSTREAM.get():
            return
        if self.json is not None:
            schema = _parse(self.json, field, "the JSON schema") if isinstance(self.json, str) else self.json
            if not isinstance(schema, (dict, bool)):
                raise SamplingParamError(field, "a JSON schema must be an object")
            # The server leaves schemas to this one walk (tram/server/protocol/structured.py).
            fault = json_fault(schema)
            if fault is not None:
                raise SamplingParamError(field, f"the JSON schema in {field}: {fault}")
        if isinstance(self.structural_tag, str) and self.structural_tag.strip():
            _parse(self.structural_tag, field, "the structural tag")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise SamplingParamError(field, "choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SamplingParamError(field, f"{name} must be a non-empty string")

    def __repr__(self) -> str:
        # Request log lines print the params: a schema of hundreds of KB must neither fill the log
        # nor be formatted whole first (tens of ms of the server's event loop, per request).
        value = short_repr(getattr(self, self.kind), REPR_CHARS)
        options = "".join(
            f", {name}=True"
            for name in ("disable_any_whitespace", "disable_additional_properties")
            if getattr(self, name)
        )
        return f"StructuredOutputsParams({self.kind}={value}{options})"

    @property
    def kind(self) -> str:
        return next(name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False))

    def key(self) -> tuple[str, str]:
        """(kind, spec text): equal keys compile to the same grammar, so this keys the cache."""
        kind = self.kind
        if kind == "json":
            # msgspec: a tenth of json.dumps' time (~1 ms for a 450 KB schema), on the step loop.
            spec = self.json if isinstance(self.json, str) else msgspec.json.encode(self.json, order="sorted").decode()
            spec = json.dumps(
                [spec, self.disable_any_whitespace, self.disable_additional_properties, self.whitespace_pattern]
            )
        elif kind == "json_object":
            spec = json.dumps([self.disable_any_whitespace, self.whitespace_pattern])
        elif kind == "choice":
            spec = json.dumps(self.choice)
        else:
            spec = getattr(self, kind)
        return kind, spec

    def schema(self) -> dict[str, Any] | bool:
        """The JSON schema as an object (kind "json" only)."""
        assert self.json is not None
        return json.loads(self.json) if isinstance(self.json, str) else self.json
