"""Turns a batch of logits into next tokens (and their logprobs), vectorised over the batch.

Order follows vLLM v1: raw logprobs, the logits processors that can change the argmax (min_tokens,
logit_bias, penalties), greedy argmax, temperature, the argmax-invariant ones (min_p), top_k/top_p,
then an exponential-race draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tram.model.kernels.cpu_kernels import argmax_rows
from tram.sampling_params import SAMPLING_EPS
from tram.worker.logits_processors import Stage
from tram.worker.sampling_metadata import SamplingMetadata


@dataclass
class LogprobsTensors:
    """Column 0: the chosen token and its logprob; columns 1..K: top-K by logprob, descending."""

    token_ids: torch.Tensor  # [N, K+1] int64
    logprobs: torch.Tensor  # [N, K+1] float32
    ranks: torch.Tensor  # [N] int64, 1 + number of tokens with a strictly larger logprob

    def tolists(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Plain lists, the form that may cross the process boundary."""
        return self.token_ids.tolist(), self.logprobs.tolist(), self.ranks.tolist()


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int) -> LogprobsTensors:
    """Logprobs of `token_ids` under `logits` plus the top `num_logprobs` alternatives.

    Used for sampled tokens (logits = the raw, unprocessed logits) and for prompt logprobs
    (token_ids = the next prompt token at each position).
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    token_ids = token_ids.long()
    chosen = logprobs.gather(-1, token_ids.unsqueeze(-1))  # [N, 1]
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [N]
    if num_logprobs > 0:
        top_vals, top_ids = torch.topk(logprobs, min(num_logprobs, logprobs.shape[-1]), dim=-1)
        ids = torch.cat([token_ids.unsqueeze(-1), top_ids], dim=-1)  # [N, K+1]
        vals = torch.cat([chosen, top_vals], dim=-1)  # [N, K+1]
    else:
        ids, vals = token_ids.unsqueeze(-1), chosen
    return LogprobsTensors(token_ids=ids, logprobs=vals, ranks=ranks)


class Sampler(torch.nn.Module):
    """Samples one token per row. May edit `logits` in place unless logprobs are requested."""

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        assert logits.dim() == 2 and logits.shape[-1] == meta.vocab_size, (logits.shape, meta.vocab_size)
        want_logprobs = meta.max_num_logprobs is not None
        raw_logits = logits
        if want_logprobs or logits.dtype != torch.float32:
            # The processed logits must not overwrite the raw ones that logprobs report.
            logits = logits.float() if logits.dtype != torch.float32 else logits.clone()

        logits = apply_logits_processors(logits, meta)
        sampled = sample(logits, meta)

        logprobs = None
        if want_logprobs:
            logprobs = compute_token_logprobs(raw_logits, sampled, meta.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)


def apply_logits_processors(
    logits: torch.Tensor, meta: SamplingMetadata, stage: Stage = Stage.BEFORE_ARGMAX
) -> torch.Tensor:
    """Run the batch's active processors of one stage, in order."""
    for processor in meta.processors:
        if processor.stage is stage and processor.active:
            logits = processor.apply(logits)
    return logits


def sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Greedy rows take the argmax; the others go through temperature, filters and a draw."""
    greedy = None if meta.all_random else argmax_rows(logits)
    if meta.all_greedy:
        assert greedy is not None
        return greedy
    assert meta.temperature is not None
    is_greedy = meta.temperature < SAMPLING_EPS  # [B]
    # Greedy rows divide by 1 so that they stay finite; their draw is discarded below.
    temperature = torch.where(is_greedy, torch.ones_like(meta.temperature), meta.temperature)
    logits = logits / temperature.unsqueeze(-1)
    logits = apply_logits_processors(logits, meta, Stage.AFTER_TEMPERATURE)
    if meta.top_k is not None or meta.top_p is not None:
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p, meta.max_top_k)
    probs = torch.softmax(logits, dim=-1)
    random = exponential_race(probs, meta.generators)
    if greedy is None:
        return random
    return torch.where(is_greedy, greedy, random)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None, max_top_k: int
) -> torch.Tensor:
    """Keep the k largest logits (ties at the k-th kept) and the smallest nucleus of mass top_p.

    top_k alone needs only the k-th value per row (a topk up to the batch's largest k);
    top_p needs one full ascending sort, in which top_k is applied as well.
    """
    vocab = logits.shape[-1]
    if top_p is None:
        assert top_k is not None
        kth = torch.topk(logits, max_top_k, dim=-1).values.gather(-1, (top_k - 1).unsqueeze(-1))  # [B, 1]
        return logits.masked_fill(logits < kth, float("-inf"))

    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)  # [B, V] ascending
    if top_k is not None:
        kth = sorted_logits.gather(-1, (vocab - top_k).unsqueeze(-1))  # [B, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # [B, V] ascending mass
    # Drop the low tail whose mass stays within 1 - p; the top token always survives.
    drop = cum <= (1.0 - top_p).unsqueeze(-1)
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """argmax(p / E) with E ~ Exponential(1) draws token i with probability p_i, without a CDF
    search. Seeded rows draw E from their own generator, so their tokens do not depend on
    the rest of the batch."""
    noise = torch.empty_like(probs)  # [B, V]
    if len(generators) < probs.shape[0]:
        noise.uniform_()
    for row, gen in generators.items():
        noise[row].uniform_(generator=gen)
    # E = -log(1 - U) is Exponential(1) (inverse CDF; 1 - U lies in (0, 1], so E is finite). On a
    # CPU, torch's exponential_ is several times slower than uniform_ plus these passes.
    noise.neg_().add_(1.0).log_().neg_()
    # An exact 0 draw would make 0/0 = NaN on a filtered token, and argmax prefers NaN.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return argmax_rows(probs / noise)
