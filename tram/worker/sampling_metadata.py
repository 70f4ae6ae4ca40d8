"""Per-step batched sampling tensors, built from the requests in the batch."""
from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

import torch

from tram.sampling_params import SamplingParams, SamplingType
from tram.worker.device_copy import to_device


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of the batch this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # Seeded requests only. The model runner seeds it once and keeps it across steps, so that
    # the request's noise stream does not depend on which other requests share the batch.
    generator: torch.Generator | None = None
    # Masked while len(output_token_ids) < min_tokens: stop_token_ids plus every eos id.
    stop_token_ids: Set[int] = field(default_factory=frozenset)


@dataclass
class TokenMask:
    """Sparse (row, token) pairs whose logit becomes -inf."""

    rows: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64


@dataclass
class TokenBias:
    """Sparse (row, token) pairs with an additive bias."""

    rows: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32


@dataclass
class SamplingMetadata:
    """Batched sampling state for one step. A field is None when no row in the batch needs it,
    so the sampler skips that stage entirely."""

    vocab_size: int
    all_greedy: bool
    all_random: bool
    temperature: torch.Tensor | None  # [B] float32, 0.0 on greedy rows; None when all greedy
    top_p: torch.Tensor | None  # [B] float32, 1.0 where disabled
    top_k: torch.Tensor | None  # [B] int64, vocab_size where disabled
    max_top_k: int  # host copy of top_k.max(), so the sampler never syncs to read it; 0 if None
    min_p: torch.Tensor | None  # [B] float32, 0.0 where disabled
    generators: dict[int, torch.Generator]  # row index -> generator of a seeded row
    # Largest number of top logprobs requested in the batch (-1 resolved to vocab_size);
    # None when no row asked for logprobs.
    max_num_logprobs: int | None
    presence_penalties: torch.Tensor | None  # [B] float32
    frequency_penalties: torch.Tensor | None  # [B] float32
    repetition_penalties: torch.Tensor | None  # [B] float32
    # Padded with vocab_size, which lands in a discarded extra bin when counting.
    prompt_token_ids: torch.Tensor | None  # [B, max_prompt_len] int64; only for repetition
    output_token_ids: torch.Tensor | None  # [B, max_output_len] int64
    min_tokens_mask: TokenMask | None
    logit_bias: TokenBias | None

    @property
    def no_penalties(self) -> bool:
        return self.output_token_ids is None


def build_sampling_metadata(rows: list[SamplingRow], vocab_size: int,
                            device: torch.device | str) -> SamplingMetadata:
    """Turn the batch's per-request params into tensors on `device` (one row per request)."""
    device = torch.device(device)
    params = [r.params for r in rows]
    types = [p.sampling_type for p in params]
    all_greedy = all(t == SamplingType.GREEDY for t in types)
    all_random = not any(t == SamplingType.GREEDY for t in types)

    def column(values: list, dtype: torch.dtype) -> torch.Tensor:
        return to_device(values, dtype, device)

    temperature = None if all_greedy else column([p.temperature for p in params], torch.float32)
    top_p = top_k = min_p = None
    max_top_k = 0
    if not all_greedy:
        if any(p.top_p < 1.0 for p in params):
            top_p = column([p.top_p for p in params], torch.float32)
        if any(0 < p.top_k < vocab_size for p in params):
            ks = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
            top_k, max_top_k = column(ks, torch.int64), max(ks)
        if any(p.min_p > 0.0 for p in params):
            min_p = column([p.min_p for p in params], torch.float32)

    generators = {i: r.generator for i, r in enumerate(rows)
                  if r.generator is not None and types[i] == SamplingType.RANDOM_SEED}

    requested = [vocab_size if p.logprobs == -1 else p.logprobs for p in params if p.logprobs is not None]
    max_num_logprobs = min(max(requested), vocab_size) if requested else None

    meta = SamplingMetadata(
        vocab_size=vocab_size, all_greedy=all_greedy, all_random=all_random,
        temperature=temperature, top_p=top_p, top_k=top_k, max_top_k=max_top_k, min_p=min_p,
        generators=generators, max_num_logprobs=max_num_logprobs,
        presence_penalties=None, frequency_penalties=None, repetition_penalties=None,
        prompt_token_ids=None, output_token_ids=None,
        min_tokens_mask=_build_min_tokens_mask(rows, device),
        logit_bias=_build_logit_bias(rows, device),
    )
    _fill_penalties(meta, rows, vocab_size, device)
    return meta


def _fill_penalties(meta: SamplingMetadata, rows: list[SamplingRow], vocab_size: int,
                    device: torch.device) -> None:
    params = [r.params for r in rows]
    use_rep = any(p.repetition_penalty != 1.0 for p in params)
    use_freq_pres = any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params)
    if not (use_rep or use_freq_pres):
        return
    # Neutral values (1, 0, 0) on rows without penalties leave their logits bit-identical.
    meta.repetition_penalties = to_device([p.repetition_penalty for p in params], torch.float32, device)
    meta.frequency_penalties = to_device([p.frequency_penalty for p in params], torch.float32, device)
    meta.presence_penalties = to_device([p.presence_penalty for p in params], torch.float32, device)
    meta.output_token_ids = _pad([r.output_token_ids for r in rows], vocab_size, device)
    if use_rep:
        meta.prompt_token_ids = _pad([r.prompt_token_ids for r in rows], vocab_size, device)


def _build_min_tokens_mask(rows: list[SamplingRow], device: torch.device) -> TokenMask | None:
    row_idx: list[int] = []
    token_ids: list[int] = []
    for i, r in enumerate(rows):
        if len(r.output_token_ids) >= r.params.min_tokens:
            continue
        stop_ids = sorted(r.stop_token_ids)
        row_idx.extend([i] * len(stop_ids))
        token_ids.extend(stop_ids)
    if not row_idx:
        return None
    return TokenMask(to_device(row_idx, torch.int64, device), to_device(token_ids, torch.int64, device))


def _build_logit_bias(rows: list[SamplingRow], device: torch.device) -> TokenBias | None:
    row_idx: list[int] = []
    token_ids: list[int] = []
    values: list[float] = []
    for i, r in enumerate(rows):
        bias = r.params.logit_bias
        if not bias:
            continue
        row_idx.extend([i] * len(bias))
        token_ids.extend(bias.keys())
        values.extend(bias.values())
    if not row_idx:
        return None
    return TokenBias(to_device(row_idx, torch.int64, device), to_device(token_ids, torch.int64, device),
                     to_device(values, torch.float32, device))


def _pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    return to_device([list(s) + [pad_id] * (width - len(s)) for s in seqs], torch.int64, device)
