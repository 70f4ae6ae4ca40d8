"""N-gram prompt lookup (vLLM's `ngram` method, llama.cpp's lookup decoding): the last n tokens of a
request (prompt and output so far) are looked for earlier in the same tokens; the tokens that
followed their latest earlier occurrence are the draft. Longer n-grams are tried first, from
prompt_lookup_max down to prompt_lookup_min. Where fewer than k tokens follow that occurrence (a
loop: the occurrence is a period back), the draft goes on around the loop: what followed it is what
followed again, so the continuation repeats with that period. Costs no model: it pays where outputs copy their
prompt (code edits, quotations, summaries) and drafts nothing elsewhere.
"""

from __future__ import annotations

import numpy as np

from tram.config.speculative import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.n_min = config.prompt_lookup_min
        self.n_max = config.prompt_lookup_max

    def propose(self, context: np.ndarray, max_tokens: int | None = None) -> list[int]:
        """Up to k (and max_tokens) draft tokens to follow `context` [L] (token ids); [] if its last
        n-gram occurs nowhere earlier."""
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        size = len(context)
        if k <= 0 or size <= self.n_min:
            return []
        # The search runs over the tokens' bytes (bytes.rfind: the latest occurrence, in C); a hit
        # must start on a token's boundary. An occurrence must end before the last token, so that a
        # token follows it.
        tokens = np.ascontiguousarray(context, dtype=np.int32)
        raw, width = tokens.tobytes(), 4
        limit = (size - 1) * width
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            suffix = raw[(size - n) * width :]
            end = limit
            while (hit := raw.rfind(suffix, 0, end)) >= 0 and hit % width:
                end = hit + len(suffix) - 1  # a match across token boundaries: look further back
            if hit >= 0:
                start = hit // width + n
                period = size - start
                return tokens[start + np.arange(k) % period].tolist()
        return []
