"""Sizing the KV cache on a GPU: whatever memory is left after the weights and the worst step.

vLLM's recipe: run one forward at the largest step the scheduler may build (max_num_batched_tokens
tokens) plus the sampler's logits for max_num_seqs rows, read the peak allocation, and give the KV
cache gpu_memory_utilization x total memory minus weights, that peak, and what lives outside
PyTorch's allocator (CUDA context, cuBLAS workspaces).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tram.distributed import get_pp
from tram.model.attention.base import AttentionMetadata

logger = logging.getLogger(__name__)


@dataclass
class MemoryProfile:
    total: int
    weights: int
    peak_activations: int
    non_torch: int

    def kv_cache_budget(self, gpu_memory_utilization: float) -> int:
        return int(gpu_memory_utilization * self.total) - self.weights - self.peak_activations - self.non_torch


def dummy_prefill_meta(
    num_tokens: int, max_model_len: int, block_size: int, device: torch.device
) -> tuple[AttentionMetadata, int]:
    """Metadata for num_tokens of fresh prompts (as many max_model_len sequences as needed) over
    private blocks 0..n-1; returns it with the number of blocks it uses."""
    lens = [max_model_len] * (num_tokens // max_model_len)
    if num_tokens % max_model_len:
        lens.append(num_tokens % max_model_len)
    blocks_per_seq = [-(-n // block_size) for n in lens]
    width = max(blocks_per_seq)
    tables = torch.zeros((len(lens), width), dtype=torch.int32)
    slots, next_block = [], 0
    for i, (n, nb) in enumerate(zip(lens, blocks_per_seq)):
        tables[i, :nb] = torch.arange(next_block, next_block + nb, dtype=torch.int32)
        pos = torch.arange(n)
        slots.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
        next_block += nb
    qsl = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=num_tokens,
        slot_mapping=torch.cat(slots).to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        query_lens_list=lens,
        seq_lens_list=lens,
        max_query_len=max(lens),
        max_seq_len=max(lens),
    )
    return meta, next_block


@torch.inference_mode()
def run_dummy_step(runner: object, num_tokens: int, num_logit_rows: int) -> int:
    """One forward over num_tokens prompt tokens and the logits of num_logit_rows rows, on a
    temporary KV cache just large enough (freed on return); returns that cache's size in bytes."""
    mc = runner.model_config
    meta, num_blocks = dummy_prefill_meta(num_tokens, mc.max_model_len, runner.block_size, runner.device)
    shape = (2, num_blocks, runner.block_size, runner.num_kv_heads, runner.head_dim)
    caches = [torch.zeros(shape, dtype=runner.kv_cache_dtype, device=runner.device) for _ in range(runner.num_layers)]
    ids = torch.randint(0, runner.vocab_size, (num_tokens,), device=runner.device)
    positions = torch.cat([torch.arange(n, device=runner.device) for n in meta.query_lens_list])
    pp = get_pp()
    # A later pipeline stage runs on stand-in hidden states: no stage talks to another here.
    received = (
        None
        if pp.is_first
        else torch.zeros(
            num_tokens, runner.model_config.hf_config.hidden_size, dtype=runner.dtype, device=runner.device
        )
    )
    hidden = runner.model(ids, positions, caches, meta, received)
    if pp.is_last:
        rows = hidden[-min(num_logit_rows, num_tokens) :]
        torch.softmax(runner.model.compute_logits(rows), dim=-1)  # the sampler's largest temporaries
    return sum(c.numel() * c.element_size() for c in caches)


def profile_cuda_memory(runner: object, num_tokens: int, num_logit_rows: int) -> MemoryProfile:
    device = runner.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    weights = torch.cuda.memory_allocated(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    temp_kv = run_dummy_step(runner, num_tokens, num_logit_rows)
    torch.cuda.synchronize(device)
    peak = max(0, torch.cuda.max_memory_allocated(device) - weights - temp_kv)
    torch.cuda.empty_cache()
    profile = MemoryProfile(total, weights, peak, non_torch)
    logger.info(
        "GPU memory: total %.2f GiB, weights %.2f GiB, peak activations %.2f GiB at %d tokens, "
        "outside PyTorch %.2f GiB",
        total / 2**30,
        weights / 2**30,
        peak / 2**30,
        num_tokens,
        non_torch / 2**30,
    )
    return profile
