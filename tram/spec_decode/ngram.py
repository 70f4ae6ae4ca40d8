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
        # Earlier positions j holding the last token: each ends a candidate n-gram (j + 1 < size, so
        # every candidate has a token after it to propose).
        ends = np.flatnonzero(context[: size - 1] == context[-1])
        if ends.size == 0:
            return []
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            fits = ends[ends >= n - 1]
            if fits.size == 0:
                continue
            suffix = context[size - n :]
            # windows[i, t] = context[fits[i] - n + 1 + t]: the n tokens ending at each candidate
            windows = context[fits[:, None] + np.arange(1 - n, 1)]
            hits = fits[(windows == suffix).all(axis=1)]
            if hits.size:
                start = int(hits[-1]) + 1
                period = size - start
                return context[start + np.arange(k) % period].tolist()
        return []
