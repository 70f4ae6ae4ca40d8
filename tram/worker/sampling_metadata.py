"""Batched sampling state: the per-row columns the sampler itself reads (temperature, top-k, top-p,
generators, logprobs) and the logits processors that own everything else.

The persistent batch rebuilds it only when its membership changes (`build_sampling_metadata` with
its long-lived processors); built from scratch from a list of rows, it is what a test or the
memory profiler uses, and what the persistent batch must always equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tram.sampling_params import SamplingType
from tram.worker.device_copy import to_device
from tram.worker.logits_processors import (
    LOGITS_PROCESSORS,
    LogitBiasProcessor,
    LogitsProcessor,
    MinPProcessor,
    MinTokensProcessor,
    PenaltiesProcessor,
    SamplingRow,
    TokenBias,
    TokenMask,
)

__all__ = ["SamplingMetadata", "SamplingRow", "build_sampling_metadata", "make_logits_processors"]


@dataclass
class SamplingMetadata:
    """A field is None when no row in the batch needs it, so the sampler skips that stage entirely."""

    vocab_size: int
    all_greedy: bool
    all_random: bool
    temperature: torch.Tensor | None  # [B] float32, 0.0 on greedy rows; None when all greedy
    top_p: torch.Tensor | None  # [B] float32, 1.0 where disabled
    top_k: torch.Tensor | None  # [B] int64, vocab_size where disabled
    max_top_k: int  # host copy of top_k.max(), so the sampler never syncs to read it; 0 if None
    generators: dict[int, torch.Generator]  # row index -> generator of a seeded row
    # Largest number of top logprobs requested in the batch (-1 resolved to vocab_size);
    # None when no row asked for logprobs.
    max_num_logprobs: int | None
    processors: Sequence[LogitsProcessor]  # in the order they run

    @property
    def plain_greedy(self) -> bool:
        """Every row greedy, no logprobs, no processor active: each draw is the raw logits' argmax."""
        return self.all_greedy and self.max_num_logprobs is None and not any(p.active for p in self.processors)

    def _processor(self, kind: type) -> LogitsProcessor | None:
        return next((p for p in self.processors if isinstance(p, kind) and p.active), None)

    @property
    def min_tokens_mask(self) -> TokenMask | None:
        p = self._processor(MinTokensProcessor)
        return p.mask if p is not None else None

    @property
    def logit_bias(self) -> TokenBias | None:
        p = self._processor(LogitBiasProcessor)
        return p.bias if p is not None else None

    @property
    def min_p(self) -> torch.Tensor | None:
        p = self._processor(MinPProcessor)
        return p.min_p if p is not None else None

    @property
    def penalties(self) -> PenaltiesProcessor | None:
        return self._processor(PenaltiesProcessor)

    @property
    def no_penalties(self) -> bool:
        return self.penalties is None


def make_logits_processors(vocab_size: int, device: torch.device | str) -> list[LogitsProcessor]:
    return [cls(vocab_size, torch.device(device)) for cls in LOGITS_PROCESSORS]


def build_sampling_metadata(
    rows: Sequence[SamplingRow],
    vocab_size: int,
    device: torch.device | str,
    processors: Sequence[LogitsProcessor] | None = None,
) -> SamplingMetadata:
    """The batch's sampling state, one row per request; `processors` (kept by a persistent batch)
    are brought up to date, or fresh ones are made."""
    device = torch.device(device)
    if processors is None:
        processors = make_logits_processors(vocab_size, device)
    for p in processors:
        p.update_rows(rows)
    params = [r.params for r in rows]
    types = [p.sampling_type for p in params]
    all_greedy = all(t == SamplingType.GREEDY for t in types)
    all_random = not any(t == SamplingType.GREEDY for t in types)

    def column(values: list, dtype: torch.dtype) -> torch.Tensor:
        return to_device(values, dtype, device)

    temperature = None if all_greedy else column([p.temperature for p in params], torch.float32)
    top_p = top_k = None
    max_top_k = 0
    if not all_greedy:
        if any(p.top_p < 1.0 for p in params):
            top_p = column([p.top_p for p in params], torch.float32)
        if any(0 < p.top_k < vocab_size for p in params):
            ks = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
            top_k, max_top_k = column(ks, torch.int64), max(ks)
    generators = {
        i: r.generator for i, r in enumerate(rows) if r.generator is not None and types[i] == SamplingType.RANDOM_SEED
    }
    requested = [vocab_size if p.logprobs == -1 else p.logprobs for p in params if p.logprobs is not None]
    return SamplingMetadata(
        vocab_size=vocab_size,
        all_greedy=all_greedy,
        all_random=all_random,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_top_k=max_top_k,
        generators=generators,
        max_num_logprobs=min(max(requested), vocab_size) if requested else None,
        processors=processors,
    )
