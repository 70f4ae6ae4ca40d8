"""llguidance (`--structured-outputs-backend guidance`): an Earley parser over a lexer, computing
each mask on demand; no ahead-of-time compile, so huge schemas start at once."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import KIND_NAMES, GrammarBackend, GrammarCompileError, Matcher


class GuidanceMatcher(Matcher):
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return bool(self.matcher.consume_token(token_id)) and not self.matcher.is_error()

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()


def _json_options(params: StructuredOutputsParams) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if params.whitespace_pattern is not None:
        options["whitespace_pattern"] = params.whitespace_pattern
    elif params.disable_any_whitespace:
        options["whitespace_flexible"] = False
    return options


_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def no_additional_properties(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that does not say otherwise."""
    if isinstance(schema, list):
        return [no_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    # Values (enum, const, default, examples) are data, not schemas: left as they are.
    out = {k: v if k in _DATA_KEYWORDS else no_additional_properties(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


class GuidanceBackend(GrammarBackend):
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        super().__init__(tokenizer, vocab_size, stop_token_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids or None)

    def _grammar(self, params: StructuredOutputsParams) -> str:
        kind = params.kind
        if kind in ("json", "json_object"):
            schema = params.schema() if kind == "json" else {"type": "object"}
            if isinstance(schema, dict):
                if params.disable_additional_properties:
                    schema = no_additional_properties(schema)
                schema = {**schema, "x-guidance": _json_options(params)}
            return llguidance.grammar_from("json_schema", json.dumps(schema))
        if kind == "regex":
            return llguidance.grammar_from("regex", params.regex or "")
        if kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(params.choice))
        if kind == "grammar":
            return llguidance.grammar_from("grammar", params.grammar or "")
        raise GrammarCompileError(
            params.source_field or "structured_outputs", "structural_tag needs the xgrammar backend"
        )

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        field = params.source_field or "structured_outputs"
        try:
            grammar = self._grammar(params)
        except ValueError as e:
            raise GrammarCompileError(field, f"invalid {KIND_NAMES[params.kind]}: {e}") from e
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise GrammarCompileError(field, f"invalid {KIND_NAMES[params.kind]}: {error.strip().splitlines()[0]}")
        # The template matcher; each request deep-copies it.
        return llguidance.LLMatcher(self.tokenizer, grammar)

    def matcher(self, compiled: llguidance.LLMatcher) -> Matcher:
        return GuidanceMatcher(compiled.deep_copy())
