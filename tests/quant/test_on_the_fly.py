"""On-the-fly weight-only quantization (`quantization="int8"` / `"int4"`): torch's CPU kernels
against dequantize-then-matmul on random shapes, and whole models against transformers running
the same dequantized weights (the oracle: what the quantized model means)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_no_leak
from kernel_checks import assert_batch_and_thread_invariant, assert_close_to_reference, assert_slabs_match
from quant_oracle import assert_matches_oracle, float_model_dir

from tram import LLM, SamplingParams
from tram.model.kernels.cpu_kernels import cpu_kernels_available
from tram.model.quant import weights
from tram.model.quant.apply import quantize_weight
from tram.model.quant.weights import (
    SKINNY_MAX_ROWS,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    int4_group_size,
    pack_int4,
    reference_linear,
    unpack_int4,
)

SHAPES = [(16, 32), (50, 100), (64, 256), (33, 384)]  # [N, K]: odd row counts, K not a multiple of 16
GEMM_ROWS = (SKINNY_MAX_ROWS + 1, 40, 100)  # past the skinny kernel: quant_gemm


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def _quantized(method: str, w: torch.Tensor) -> QuantizedWeight:
    qw, used = quantize_weight(method, w)
    assert used.startswith(method if int4_group_size(w.shape[1]) else "int8")
    return qw


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_kernels_match_dequantize_then_matmul(n: int, k: int, dtype: torch.dtype, method: str):
    qw = _quantized(method, _weight(n, k, n + k).to(dtype))
    bias = torch.randn(n).to(dtype)
    for rows in (1, 3, 5, SKINNY_MAX_ROWS) + GEMM_ROWS:  # the skinny kernel, then the tiled GEMM
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)
        with torch.inference_mode():
            got, want = qw.apply(x, bias), reference_linear(x, qw, bias)
        assert want.shape == (rows, n)
        assert_close_to_reference(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_many_rows_decode_slabs_for_the_library_gemm(monkeypatch, method: str, dtype: torch.dtype):
    """x past SKINNY_MAX_ROWS where the library GEMM wins (bf16: native bf16 GEMMs; float32: kernels
    built without AVX-512): W decoded to x's dtype a slab at a time (quant_dequantize_ on row ranges
    of the quants and scales); 131 outputs in slabs of 48."""
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available")
    qw = _quantized(method, _weight(131, 256, 3))
    assert_slabs_match(monkeypatch, qw, torch.randn(40, 256).to(dtype), torch.randn(131).to(dtype), 48)


@pytest.mark.parametrize("n,k", [(131, 512), (70, 96)])  # N past a tile of 64 and odd; K not a multiple of 32
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zero", [False, True])
def test_int4_gemm_groups_and_zero_points(n: int, k: int, group: int, zero: bool):
    from tram.model.quant.checkpoint_weight import CheckpointInt4Weight

    if k % group:
        pytest.skip("the group does not divide K")
    g = torch.Generator().manual_seed(n * group)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // group, generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 16, (n, k // group), generator=g, dtype=torch.uint8) if zero else None
    qw = CheckpointInt4Weight(q, scale, group, zeros)
    bias = torch.randn(n, generator=g)
    for rows in GEMM_ROWS:
        x = torch.randn(rows, k, generator=g)
        with torch.inference_mode():
            got, want = qw.apply(x, bias), reference_linear(x, qw, bias)
        scale_out = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=1e-5 * scale_out, rtol=1e-5)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_gemm_is_invariant_to_batch_and_threads(monkeypatch, method: str):
    """The tiled GEMM's outputs do not depend on the rows beside them nor on the thread count. Kernels
    built without AVX-512 send these 100 rows to MKL's slabs (slab_gemm.py), whose order of additions
    is MKL's and may change with the threads (it does on AMD's Zen 4): kept on the tiled GEMM here."""
    from tram.model.quant import slab_gemm

    monkeypatch.setattr(slab_gemm, "float32_gemm_faster", lambda kernels: False)
    qw = _quantized(method, _weight(150, 320, 6))  # three tiles, the last partial
    x = torch.randn(100, 320)
    threads = torch.get_num_threads()
    with torch.inference_mode():
        together = qw.apply(x, None)
        assert torch.equal(qw.apply(x[3 : 3 + SKINNY_MAX_ROWS + 2], None), together[3 : 3 + SKINNY_MAX_ROWS + 2])
        torch.set_num_threads(1)
        try:
            assert torch.equal(qw.apply(x, None), together)
        finally:
            torch.set_num_threads(threads)
        torch.set_num_threads(2)
        try:
            assert torch.equal(qw.apply(x, None), together)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_skinny_kernel_is_invariant_to_batch_and_threads(method: str):
    qw = _quantized(method, _weight(96, 320, 5))
    assert_batch_and_thread_invariant(lambda x: qw.apply(x, None), torch.randn(SKINNY_MAX_ROWS, 320))


@pytest.mark.parametrize("n,k", SHAPES)
def test_dequantized_weights_are_the_rounding_of_the_originals(n: int, k: int):
    w = _weight(n, k, 7)
    w8 = Int8Weight(w)
    assert w8.qweight.dtype == torch.int8 and w8.qweight.abs().max() <= 127
    assert ((w8.dequantize() - w).abs() <= w8.scale[:, None] / 2 + 1e-7).all()
    group = int4_group_size(k)
    if group is None:
        return
    w4 = Int4Weight(w, group)
    scale = w4.scale.repeat_interleave(group, dim=1)  # [N, K]
    assert ((w4.dequantize() - w).abs() <= scale / 2 + 1e-7).all()
    assert w4.nbytes < w8.nbytes < w.numel() * 4  # about 1/8 and 1/4 of float32, plus scales


def test_int4_packing_round_trips_and_falls_back_to_int8_where_no_group_fits():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    assert pack_int4(q)[0, 3] == q[0, 3] | (q[0, 19] << 4)  # byte j of a run: k = j and k = j + 16
    assert int4_group_size(256) == 128 and int4_group_size(96) == 32
    assert int4_group_size(172) is None
    assert quantize_weight("int4", _weight(64, 172, 1))[1] == "int8"


def test_without_the_kernels_the_reference_path_runs(monkeypatch):
    qw = Int4Weight(_weight(64, 256, 3), 128)
    x = torch.randn(2, 256)
    monkeypatch.setattr(weights, "kernels_for", lambda x: None)
    with torch.inference_mode():
        assert torch.equal(qw.apply(x, None), reference_linear(x, qw, None))


# ---- whole models ------------------------------------------------------------------------------
def _dequantized_hf_model(path: str, method: str) -> torch.nn.Module:
    """transformers' model with every decoder linear replaced by its quantized-then-dequantized
    weight: the same function of the checkpoint that Tram's quantized layers compute."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(quantize_weight(method, module.weight)[0].dequantize())
    return model


PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206], [1, 5], [1, 99, 98, 97, 96, 95, 94]]


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_greedy_and_logprobs_match_transformers_on_dequantized_weights(tmp_path, method: str):
    path = float_model_dir(tmp_path)  # int4 groups of 128 everywhere
    llm = LLM(path, quantization=method, max_num_seqs=4, max_model_len=256, max_num_batched_tokens=8)
    assert_matches_oracle(llm, _dequantized_hf_model(path, method), PROMPTS, 12)
    assert_no_leak(llm.llm_engine)


def test_quantized_model_is_smaller_and_unknown_methods_are_refused(stories_path: str):
    llm = LLM(stories_path, quantization="int8", max_num_seqs=2, max_model_len=64)
    runner = llm.llm_engine.engine_core.executor.model_runner
    layers = [m for m in runner.model.modules() if getattr(m, "quant", None) is not None]
    assert len(layers) == 5 * 7  # q, k, v, o, gate, up, down in each of the 5 layers
    assert all(m.weight.numel() == 0 for m in layers)  # the float weights are gone
    assert (
        llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0].text
    )
    with pytest.raises(ValueError, match="quantization 'fp6' is not supported: choose int8 or int4"):
        LLM(stories_path, quantization="fp6")
