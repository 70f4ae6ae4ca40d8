"""What the quantized-model tests share: the random Llama they quantize, and the check of an engine's
greedy tokens and logprobs against transformers running the dequantized weights as a float model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import make_hf_model_dir
from hf_quant_packers import write_quantized

from tram import LLM, SamplingParams


def float_model_dir(folder: Any, **overrides: Any) -> str:
    """A random untied Llama of 256- and 512-wide rows (int4 groups of 64 and 128 fit; two tensor-
    parallel ranks get whole groups), biases on every linear."""
    config = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    return make_hf_model_dir(folder, "llama_untied", **{**config, **overrides})


def hf_oracle(folder: str) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def write_checkpoints(float_dir: str, root: Path, schemes: dict[str, tuple[dict, Any]]) -> dict[str, tuple[str, str]]:
    """scheme -> (quantized folder, float folder of its dequantized weights), each written by
    write_quantized with its scheme's (quantization_config, writer)."""
    return {
        name: (str(root / name), write_quantized(float_dir, str(root / name), config, writer))
        for name, (config, writer) in schemes.items()
    }


@torch.no_grad()
def oracle_continuation(
    oracle: torch.nn.Module, prompt: list[int], tokens: list[int], max_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """(the oracle's greedy continuation of prompt, its log-softmax [len, vocab] over prompt + tokens)."""
    want = oracle.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    ref = torch.log_softmax(oracle(torch.tensor([prompt + tokens])).logits[0].float(), dim=-1)
    return want[0, len(prompt) :].tolist(), ref


def assert_matches_oracle(
    llm: LLM, oracle: torch.nn.Module, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False
) -> None:
    """Greedy tokens equal the oracle's, chosen-token logprobs within 1e-3 of its log-softmax."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=1, ignore_eos=ignore_eos)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for p, out in zip(prompts, outs):
        comp = out.outputs[0]
        want, ref = oracle_continuation(oracle, p, comp.token_ids, max_tokens)
        assert comp.token_ids == want, p
        for i, (tid, row) in enumerate(zip(comp.token_ids, comp.logprobs)):
            assert row[tid].logprob == pytest.approx(ref[len(p) - 1 + i, tid].item(), abs=1e-3)
