"""xgrammar (the default engine): compiles JSON schemas, regexes, EBNF and structural tags into a
grammar with precomputed token masks per state, so a matcher's fill is a few microseconds."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from tram.sampling_params import StructuredOutputsParams
from tram.structured_output.backend import (
    JSON_SEPARATORS,
    KIND_NAMES,
    MASKED_OUT,
    GrammarBackend,
    GrammarCompileError,
    Matcher,
    choice_ebnf,
)
from tram.structured_output.schema_finite import endless_message, endless_ref
from tram.structured_output.xgrammar_schema import unenforced


class XgrammarMatcher(Matcher):
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        # xgrammar writes through a tensor; from_numpy shares the memory.
        self.matcher.fill_next_token_bitmask(torch.from_numpy(bitmask), row)

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def count_valid(self, tokens: list[int]) -> int:
        n = 0  # (a terminated matcher refuses everything, with a warning on stderr: not asked)
        while n < len(tokens) and not self.matcher.is_terminated() and self.matcher.accept_token(tokens[n]):
            n += 1
        if n:
            self.matcher.rollback(n)
        return n

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def refusal(self) -> str | None:
        # xgrammar leaves the matcher as it was before the refused token.
        return None if self.matcher.is_completed() else MASKED_OUT


class XgrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_threads: int = 2) -> None:
        super().__init__(tokenizer, vocab_size, stop_token_ids)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        # Tram caches compiled grammars by key itself (and counts the hits), so xgrammar's cache is off.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads, cache_enabled=False)

    # Compiling from the converted grammar gives a compiled grammar byte for byte the same as
    # compile_json_schema & co. (checked on schemas, regexes, EBNF and structural tags).
    proves_in_child = True

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(self.grammar(params))

    def prove(self, params: StructuredOutputsParams) -> str:
        """In a forked child: convert (a deep schema's conversion alone took 26 s) and compile (a wide
        one's token masks, minutes) where both can be killed, and hand back the converted grammar,
        serialized. Not the compiled one: xgrammar serializes that to ~100x its size, slower than
        compiling it again (81 MB in 4.5 s for a grammar compiled in 0.04 s)."""
        grammar = self.grammar(params)
        text = grammar.serialize_json()  # before compiling, which may rewrite it
        # One thread of the child's own: a forked child has none of the parent's pool's threads.
        xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False).compile_grammar(grammar)
        return text

    def compile_proven(self, proof: str) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(xgr.Grammar.deserialize_json(proof))

    def grammar(self, params: StructuredOutputsParams) -> xgr.Grammar:
        """The constraint converted to xgrammar's grammar, its token masks not yet computed."""
        kind = params.kind
        if params.whitespace_pattern is not None:
            raise GrammarCompileError(
                params.source_field or "structured_outputs",
                "whitespace_pattern needs --structured-outputs-backend guidance",
            )
        if kind == "json":
            self._check_schema(params)
        # JSON is compact, disable_any_whitespace or not (backend.JSON_SEPARATORS says why).
        try:
            if kind == "json":
                # strict_mode (xgrammar's default, as vLLM uses it): no properties or items beyond
                # those the schema names, so disable_additional_properties always holds here.
                return xgr.Grammar.from_json_schema(
                    params.schema(), any_whitespace=False, separators=JSON_SEPARATORS, strict_mode=True
                )
            if kind == "json_object":
                # Not the builtin JSON grammar: that allows any value (arrays too), not an object.
                return xgr.Grammar.from_json_schema(
                    {"type": "object"}, any_whitespace=False, separators=JSON_SEPARATORS
                )
            if kind == "regex":
                return xgr.Grammar.from_regex(params.regex or "")
            if kind == "choice":
                return xgr.Grammar.from_ebnf(choice_ebnf(params.choice or []))
            if kind == "grammar":
                return xgr.Grammar.from_ebnf(params.grammar or "")
            return self._structural_tag(params.structural_tag or "")
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise GrammarCompileError(
                params.source_field or "structured_outputs", f"invalid {KIND_NAMES[kind]}: {_first_line(e)}"
            ) from e

    def _check_schema(self, params: StructuredOutputsParams) -> None:
        """A 400 for a schema xgrammar would compile without enforcing it all, or one that no
        finite value satisfies (xgrammar would write until max_tokens)."""
        field, schema = params.source_field or "structured_outputs", params.schema()
        problem = unenforced(schema)
        if problem is not None:
            raise GrammarCompileError(
                field,
                f"invalid JSON schema: the xgrammar backend does not enforce {problem}; remove it, or serve "
                "with --structured-outputs-backend guidance, which enforces some of these",
            )
        ref = endless_ref(schema)
        if ref is not None:
            raise GrammarCompileError(field, f"invalid JSON schema: {endless_message(ref)}")

    def _structural_tag(self, text: str) -> xgr.Grammar:
        """xgrammar's own format ({"type": "structural_tag", "format": ...}), or vLLM's older one
        ({"structures": [{"begin", "schema", "end"}], "triggers": [...]})."""
        spec = json.loads(text)
        if isinstance(spec, dict) and "structures" in spec:
            tags = [
                xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
                for s in spec["structures"]
            ]
            return xgr.Grammar.from_structural_tag(tags, spec.get("triggers", []))
        return xgr.Grammar.from_structural_tag(text)

    def matcher(self, compiled: xgr.CompiledGrammar) -> Matcher:
        return XgrammarMatcher(compiled)


def _first_line(e: BaseException) -> str:
    """xgrammar's messages start with a time stamp and a C++ source location; the client needs the rest."""
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    return text.splitlines()[0] if text else type(e).__name__
