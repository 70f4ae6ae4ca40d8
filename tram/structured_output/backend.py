"""The seam between Tram and a grammar engine: compile a request's constraint once, then give each
request a matcher that fills its row of the token bitmask and follows the sampled tokens.

Both engines behind it (xgrammar, llguidance) use the same bitmask: int32 words, bit j of word i
allows token 32*i + j. So the worker applies it without knowing which engine filled it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from tram.config.registry import STRUCTURED_OUTPUTS_BACKENDS
from tram.sampling_params import StructuredOutputsParams

# How an error names what failed, by StructuredOutputsParams.kind.
KIND_NAMES = {
    "json": "JSON schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "JSON object",
    "structural_tag": "structural tag",
}

# JSON constraints are written compact on both engines: one line, ", " between items and ": " after
# keys (json.dumps' layout, and xgrammar's without optional whitespace). The engines' own default, any
# whitespace between tokens, lets a model that does not know JSON (stories260K) write spaces and
# newlines until max_tokens; "a newline plus indentation" cannot be optional on xgrammar (its indent
# mode forces the layout on the root object alone), so compact is the layout both engines can keep
# alike. `disable_any_whitespace` keeps each engine's vLLM layout (llguidance's: no space at all);
# guidance's `whitespace_pattern` replaces the layout with the client's own.
JSON_SEPARATORS = (", ", ": ")

# Why a token the grammar does not allow was sampled: every token it allows was masked by another setting.
MASKED_OUT = "every token the grammar allows here was masked by other settings (allowed_token_ids, logit_bias)"


class GrammarCompileError(ValueError):
    """The engine refused a schema, regex or grammar; `param` names the request field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class Matcher(ABC):
    """One request's position in its grammar."""

    @abstractmethod
    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Set row `row` of `bitmask` [R, words] to the tokens the grammar allows next."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete and has accepted its stop token."""

    @abstractmethod
    def count_valid(self, tokens: list[int]) -> int:
        """How many of `tokens`, from the first, the grammar would accept in turn (it is left as it was)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Back over the last `num_tokens` accepted tokens."""

    @abstractmethod
    def refusal(self) -> str | None:
        """Asked after accept_token refused a token. None when the text before it was a whole
        sentence of the grammar, so the output may end there (the token was one that something
        else forced past the mask: min_tokens banning the stop token); else why the grammar cannot
        go on (the engine gave up on it, as at a parser's limit, or no token could follow)."""


class GrammarBackend(ABC):
    name: str
    # An engine whose compile cannot be interrupted and may run for minutes (xgrammar) proves each
    # grammar in a child process first, where it can be killed (compile_pool.py): it sets this and
    # implements prove / compile_proven. One that bounds its own work (llguidance) compiles in a thread.
    proves_in_child = False

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids

    @abstractmethod
    def compile(self, params: StructuredOutputsParams) -> Any:
        """A compiled grammar (opaque; shared by every request with the same key). Raises
        GrammarCompileError for a constraint the engine refuses. Runs on a worker thread."""

    def prove(self, params: StructuredOutputsParams) -> Any:
        """In a forked child process: compile in full (raising as `compile` does), and return what
        `compile_proven` needs, small and picklable."""
        raise NotImplementedError

    def compile_proven(self, proof: Any) -> Any:
        """In this process: `compile`'s result from what `prove` returned, in about the time the
        proof took."""
        raise NotImplementedError

    @abstractmethod
    def matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of `compiled`."""


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices`. JSON string escapes are the EBNF
    literal's (\\", \\\\, \\n, \\uXXXX)."""
    import json

    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def _xgrammar(tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_threads: int) -> GrammarBackend:
    from tram.structured_output.xgrammar_backend import XgrammarBackend

    return XgrammarBackend(tokenizer, vocab_size, stop_token_ids, max_threads)


def _guidance(tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_threads: int) -> GrammarBackend:
    from tram.structured_output.guidance_backend import GuidanceBackend

    return GuidanceBackend(tokenizer, vocab_size, stop_token_ids)


# The grammar engines, by the names configuration validates structured_outputs_backend against; each
# engine's module is imported only when it is built. auto is vLLM's name for "the default engine".
STRUCTURED_OUTPUTS_BACKENDS.add("xgrammar", target=_xgrammar, aliases=("auto",))
STRUCTURED_OUTPUTS_BACKENDS.add("guidance", "llguidance", target=_guidance, aliases=("llguidance",))


def make_backend(
    name: str, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_threads: int
) -> GrammarBackend:
    """The registered engine `name` (or an alias of one); ValueError naming the registered ones."""
    return STRUCTURED_OUTPUTS_BACKENDS.load(name)(tokenizer, vocab_size, stop_token_ids, max_threads)
