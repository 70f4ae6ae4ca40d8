"""Quantized checkpoints on the GPU's path, run on CPU: the Triton attention backend and the Triton
W4A16 / W8A16 GEMM for every quantized Linear (Triton's interpreter; conftest sets TRITON_INTERPRET=1),
greedy tokens and logprobs against transformers on the checkpoint's dequantized weights, as the
CPU kernels are checked in test_hf_quantized.py. On a GPU the loader does the same with CUDA tensors:
`x.is_cuda` picks the Triton GEMM there; `use_triton` picks it here."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from conftest import assert_no_leak  # noqa: E402
from hf_quant_packers import write_quantized  # noqa: E402
from quant_oracle import float_model_dir  # noqa: E402
from test_hf_quantized import SCHEMES  # noqa: E402

from tram import LLM, SamplingParams  # noqa: E402
from tram.model.quant.weights import QuantizedWeight  # noqa: E402

# int4 with zero points and act-order (GPTQ asym desc_act), and per-channel int8: AWQ's zero points
# reach the kernel as GPTQ's do (test_triton_quant_linear.py covers the kernel's variants).
CASES = ("gptq-g128-asym-actorder", "ct-w8a16-channel")
PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206]]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One layer of 256-wide rows (groups of 128 fit), biases on every linear: the interpreter is slow.
    return float_model_dir(tmp_path_factory.mktemp("float"), num_hidden_layers=1)


def _on_triton(llm: LLM) -> list[QuantizedWeight]:
    model = llm.llm_engine.engine_core.model_runner.model
    weights = [m.quant for m in model.modules() if getattr(m, "quant", None) is not None]
    for weight in weights:
        weight.use_triton = True
    return weights


@pytest.mark.parametrize("scheme", CASES)
def test_triton_gemm_matches_transformers_on_the_dequantized_checkpoint(float_dir: str, tmp_path, scheme: str):
    import transformers

    config, writer = SCHEMES[scheme]
    path = str(tmp_path / scheme)
    oracle_dir = write_quantized(float_dir, path, config, writer)
    llm = LLM(path, attention_backend="triton", max_num_seqs=4, max_model_len=64, max_num_batched_tokens=8)
    assert len(_on_triton(llm)) == 7
    oracle = transformers.AutoModelForCausalLM.from_pretrained(oracle_dir, dtype=torch.float32).eval()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=1),
        use_tqdm=False,
    )
    for p, out in zip(PROMPTS, outs):
        comp = out.outputs[0]
        with torch.no_grad():
            ref = torch.log_softmax(oracle(torch.tensor([p + comp.token_ids])).logits[0].float(), dim=-1)
        # Greedy: each chosen token is the oracle's argmax after the same prefix.
        assert comp.token_ids == ref[len(p) - 1 : -1].argmax(dim=-1).tolist()
        for i, (tid, row) in enumerate(zip(comp.token_ids, comp.logprobs)):
            assert row[tid].logprob == pytest.approx(ref[len(p) - 1 + i, tid].item(), abs=1e-3)
    assert_no_leak(llm.llm_engine)
