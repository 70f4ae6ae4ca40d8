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
from tram.structured_output import backend
from tram.structured_output.backend import KIND_NAMES, MASKED_OUT, GrammarBackend, GrammarCompileError, Matcher
from tram.structured_output.schema_finite import endless_message, endless_ref


class GuidanceMatcher(Matcher):
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.could_end = False  # before the last token: a refused token leaves the matcher in error
        self.unrecorded = 0  # stop tokens taken after the matcher stopped (always the last ones)

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        self.could_end = self.matcher.is_accepting()
        stopped = self.matcher.is_stopped()
        ok = bool(self.matcher.consume_token(token_id)) and not self.matcher.is_error()
        # A stopped matcher takes its stop token without recording it: rollback must not count it.
        self.unrecorded += ok and stopped
        return ok

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def count_valid(self, tokens: list[int]) -> int:
        return int(self.matcher.validate_tokens(tokens)) if tokens else 0

    def rollback(self, num_tokens: int) -> None:
        skip = min(num_tokens, self.unrecorded)
        self.unrecorded -= skip
        if num_tokens > skip:
            self.matcher.rollback(num_tokens - skip)

    def refusal(self) -> str | None:
        if self.could_end:
            return None
        # A parser's limit ("Current row has 2002 items; max is 2000") is only logged as a warning;
        # a token outside the mask has no message of its own.
        line = first_error_line(self.matcher.get_error())
        return line if line and "no error message" not in line else MASKED_OUT


def _json_options(params: StructuredOutputsParams) -> dict[str, Any]:
    """llguidance's JSON layout: the client's whitespace_pattern; none at all for
    disable_any_whitespace (as vLLM); else compact (backend.JSON_SEPARATORS says why)."""
    if params.whitespace_pattern is not None:
        return {"whitespace_pattern": params.whitespace_pattern}
    if params.disable_any_whitespace:
        return {"whitespace_flexible": False}
    item, key = backend.JSON_SEPARATORS
    return {"whitespace_flexible": False, "item_separator": item, "key_separator": key}


def choice_regex(choices: list[str]) -> str:
    """The choices as one regex alternation, every character but letters and digits escaped: one
    lexeme for llguidance, where its `choice` grammar gives each option a parser item and breaks
    off past 2,000 of them (a parser row's limit)."""
    return "|".join("".join(c if c.isalnum() else f"\\x{{{ord(c):x}}}" for c in choice) for choice in choices)


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
            ref = endless_ref(schema)
            if ref is not None:  # llguidance would break off after "{" (its parser's item limit)
                raise ValueError(endless_message(ref))
            if isinstance(schema, dict):
                if params.disable_additional_properties:
                    schema = no_additional_properties(schema)
                schema = {**schema, "x-guidance": _json_options(params)}
            return llguidance.grammar_from("json_schema", json.dumps(schema))
        if kind == "regex":
            return llguidance.grammar_from("regex", params.regex or "")
        if kind == "choice":
            return llguidance.grammar_from("regex", choice_regex(params.choice or []))
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
        template = llguidance.LLMatcher(self.tokenizer, grammar)
        problem = self._first_token_problem(template)
        if problem is not None:
            raise GrammarCompileError(field, f"invalid {KIND_NAMES[params.kind]}: {problem}")
        return template

    def _first_token_problem(self, template: llguidance.LLMatcher) -> str | None:
        """Why the grammar fails at its first token, or None. llguidance checks a grammar's parser
        limits (a row of more than 2,000 items) only as it parses, so a grammar can validate and then
        break off at the first token; trying one on a copy turns that into a 400 up front."""
        probe = template.deep_copy()
        bitmask = llguidance.numpy.allocate_token_bitmask(1, self.vocab_size)
        llguidance.numpy.fill_next_token_bitmask(probe, bitmask, 0)
        allowed = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little")[: self.vocab_size])
        if probe.is_error() or allowed.size == 0:
            return first_error_line(probe.get_error()) or "the grammar allows no output"
        token = int(allowed[0])
        if token in self.stop_token_ids or (probe.consume_token(token) and not probe.is_error()):
            return None
        return first_error_line(probe.get_error()) or "the grammar refuses its own first token"

    def matcher(self, compiled: llguidance.LLMatcher) -> Matcher:
        return GuidanceMatcher(compiled.deep_copy())


def first_error_line(text: str) -> str:
    """llguidance's error without the parser state dump that follows it."""
    return text.strip().splitlines()[0] if text.strip() else ""
