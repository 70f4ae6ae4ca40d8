"""The transformers peers of `tram bench throughput`: static batching and transformers' own continuous batching.

Both generate exactly each request's output length, greedy, with end-of-sequence switched off, so
their output token counts equal Tram's and tokens/s compare like with like.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from tram.bench.datasets import BenchRequest

# requests -> generated token ids, one list per request, in order
GenerateFn = Callable[[list[BenchRequest]], list[list[int]]]
_PAD_ID = 0  # these models have no pad token; any id works under the attention mask


def _no_eos_config(max_new_tokens: int):
    from transformers import GenerationConfig

    # A config replacing the model's outright: generate() would otherwise merge its eos ids back in.
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None,
                            bos_token_id=None, pad_token_id=_PAD_ID)


def hf_static_backend(model_path: str, dtype: str, batch_size: int) -> GenerateFn:
    """transformers `generate` on left-padded batches in arrival order: every batch runs until its
    longest request is done, the classic static batching that continuous batching replaces."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    model.eval()

    @torch.inference_mode()
    def generate(requests: list[BenchRequest]) -> list[list[int]]:
        outputs: list[list[int]] = []
        for start in range(0, len(requests), batch_size):
            chunk = requests[start:start + batch_size]
            width = max(r.prompt_len for r in chunk)
            ids = torch.tensor([[_PAD_ID] * (width - r.prompt_len) + r.prompt_token_ids for r in chunk])
            mask = torch.tensor([[0] * (width - r.prompt_len) + [1] * r.prompt_len for r in chunk])
            longest = max(r.output_len for r in chunk)
            model.generation_config = _no_eos_config(longest)
            out = model.generate(input_ids=ids, attention_mask=mask)  # [B, width + longest]
            # Tokens past a request's own length were computed but not asked for: not counted.
            outputs.extend(row[width:width + r.output_len].tolist() for row, r in zip(out, chunk))
        return outputs

    return generate


def hf_cb_backend(model_path: str, dtype: str, attn_implementation: str = "paged|sdpa",
                  max_batch_tokens: int | None = None) -> GenerateFn:
    """transformers' continuous batching (`continuous_batching_context_manager`, paged attention),
    each request with its own max_new_tokens."""
    from transformers import AutoModelForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype),
                                                 attn_implementation=attn_implementation)
    model.eval()
    gen_config = _no_eos_config(1)
    gen_config.eos_token_id = -1  # the manager's way of saying "no eos"
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)

    def generate(requests: list[BenchRequest]) -> list[list[int]]:
        cb_config = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens)
        with model.continuous_batching_context_manager(
            generation_config=gen_config, continuous_batching_config=cb_config, block=True, timeout=30,
            persistent_manager=True,  # the warm-up call's manager (and its warm-up) is reused when timed
        ) as manager:
            ids = [manager.add_request(r.prompt_token_ids, request_id=f"bench-{i}", max_new_tokens=r.output_len)
                   for i, r in enumerate(requests)]
            results = {}
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = result
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop stopped early")
        return [list(results[i].generated_tokens) for i in ids]

    return generate
