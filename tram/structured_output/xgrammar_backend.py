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
from tram.structured_output.backend import KIND_NAMES, GrammarBackend, GrammarCompileError, Matcher, choice_ebnf


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


class XgrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_threads: int = 2) -> None:
        super().__init__(tokenizer, vocab_size, stop_token_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        # Tram caches compiled grammars by key itself (and counts the hits), so xgrammar's cache is off.
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        kind = params.kind
        if params.whitespace_pattern is not None:
            raise GrammarCompileError(
                params.source_field or "structured_outputs",
                "whitespace_pattern needs --structured-outputs-backend guidance",
            )
        try:
            if kind == "json":
                # strict_mode (xgrammar's default, as vLLM uses it): no properties or items beyond
                # those the schema names, so disable_additional_properties always holds here.
                return self.compiler.compile_json_schema(
                    params.schema(), any_whitespace=not params.disable_any_whitespace, strict_mode=True
                )
            if kind == "json_object":
                if params.disable_any_whitespace:
                    return self.compiler.compile_json_schema({"type": "object"}, any_whitespace=False)
                return self.compiler.compile_builtin_json_grammar()
            if kind == "regex":
                return self.compiler.compile_regex(params.regex)
            if kind == "choice":
                return self.compiler.compile_grammar(choice_ebnf(params.choice or []))
            if kind == "grammar":
                return self.compiler.compile_grammar(params.grammar)
            return self._compile_structural_tag(params.structural_tag or "")
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise GrammarCompileError(
                params.source_field or "structured_outputs", f"invalid {KIND_NAMES[kind]}: {_first_line(e)}"
            ) from e

    def _compile_structural_tag(self, text: str) -> xgr.CompiledGrammar:
        """xgrammar's own format ({"type": "structural_tag", "format": ...}), or vLLM's older one
        ({"structures": [{"begin", "schema", "end"}], "triggers": [...]})."""
        spec = json.loads(text)
        if isinstance(spec, dict) and "structures" in spec:
            tags = [
                xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
                for s in spec["structures"]
            ]
            return self.compiler.compile_structural_tag(tags, spec.get("triggers", []))
        return self.compiler.compile_structural_tag(text)

    def matcher(self, compiled: xgr.CompiledGrammar) -> Matcher:
        return XgrammarMatcher(compiled)


def _first_line(e: BaseException) -> str:
    """xgrammar's messages start with a time stamp and a C++ source location; the client needs the rest."""
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    return text.splitlines()[0] if text else type(e).__name__
