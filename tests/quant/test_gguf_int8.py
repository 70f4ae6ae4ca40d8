"""GGUF linears with int8 activations (`--gguf-activations int8`, csrc/gguf_int8.cpp, and csrc/gguf_q8k.h
and gguf_q8k_gemm.h for the K-quants): x quantized per 32 values (per 256 for the K-quants), integer dot
products with the weights' quants. Checked against the PyTorch reference (the same int8 activations,
dequantized, times the dequantized weight) on every kept type, shape and row count, and for what serving
needs: one numerics whatever the batch, the threads or the number of rows (the K-quants' row kernel and
repacked GEMM give the same bits)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_checks import assert_batch_and_thread_invariant, assert_close_to_reference
from test_gguf_weights import NAMES, TYPES, _blocks, _ks

from tram.model.gguf.weight import (
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    GGUFWeight,
    activation_block,
    quantize_activations,
    reference_linear,
    reference_linear_int8,
)
from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels
from tram.model.quant import weights

needs_kernels = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ kernels are not available")


def _x(rows: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0  # a block of zeros: scale 0, quants 0
    x[-1, 32:64] *= 1e4  # a loud block next to quiet ones
    return x


@needs_kernels
@pytest.mark.parametrize("block", [32, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantization_is_the_kernels_bit_for_bit(dtype: torch.dtype, block: int):
    x = _x(7, 4864 if block == 32 else 4608, 0).to(dtype)
    x[1, :256] = 0  # a whole K-quant block of zeros
    q, d = load_cpu_kernels().quantize_activations_int8(x, block)
    want_q, want_d = quantize_activations(x, block)
    assert q.dtype == torch.int8 and torch.equal(q, want_q) and torch.equal(d, want_d)
    assert int(q.abs().max()) == 127 and torch.all(q[0, :32] == 0) and d[1, 0] == 0
    back = (q.float().view(7, -1, block) * d.unsqueeze(2)).view(7, -1)
    assert torch.all((back - x.float()).abs() <= d.repeat_interleave(block, dim=1) / 2 * (1 + 1e-5))  # half a step


def test_the_k_quants_take_activations_per_256():
    """llama.cpp's Q8_K for Q4_K/Q5_K/Q6_K (a super-block sums in integers), Q8_0's 32 for the others."""
    assert [activation_block(t) for t in (Q4_K, Q5_K, Q6_K)] == [256] * 3
    assert {activation_block(t) for t in TYPES} - {256} == {32}


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_kernel_matches_the_int8_reference(ggml_type: int, dtype: torch.dtype):
    for n in (33, 50):
        for k in _ks(ggml_type):  # 96: an odd number of 32-blocks, half a chunk at the end
            qw = GGUFWeight(_blocks(ggml_type, n, k, n + k), ggml_type, k, int8_activations=True)
            bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
            for rows in (1, 3, 5, 17, 70):  # one tile of x, several, past 64 rows (a second block)
                x = _x(rows, k, rows).to(dtype)
                with torch.inference_mode():
                    got, want = qw.apply(x, bias), reference_linear_int8(x, qw, bias)
                assert want.shape == (rows, n)
                assert_close_to_reference(got, want, dtype)


@needs_kernels
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_int8_activations_stay_close_to_float_ones(ggml_type: int):
    """What quantizing x costs: about a percent of the output's scale on random data (per 256 values, the
    K-quants', a block's largest value sets a coarser step than per 32)."""
    k = 512
    qw = GGUFWeight(_blocks(ggml_type, 64, k, 1), ggml_type, k, int8_activations=True)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got, exact = qw.apply(x, None), reference_linear(x, qw, None)
    err = (got - exact).abs().max().item() / exact.abs().max().item()
    assert 0 < err < (2e-2 if activation_block(ggml_type) == 256 else 1e-2), err


@needs_kernels
@pytest.mark.parametrize("ggml_type", TYPES, ids=NAMES.get)
def test_one_numerics_for_every_batch_thread_count_and_row_count(ggml_type: int):
    for k in _ks(ggml_type):
        qw = GGUFWeight(_blocks(ggml_type, 96, k, 5), ggml_type, k, int8_activations=True)
        assert_batch_and_thread_invariant(lambda x: qw.apply(x, None), _x(16, k, 4))
        x = _x(150, k, 6)  # past 64 rows: the rows of W are decoded once per block of x
        with torch.inference_mode():
            together = qw.apply(x, None)
            assert torch.equal(qw.apply(x[100:101], None), together[100:101])
            assert torch.equal(qw.apply(x[60:75], None), together[60:75])


@needs_kernels
@pytest.mark.parametrize("ggml_type", [Q4_K, Q5_K, Q6_K], ids=NAMES.get)
def test_the_gemm_on_amx_tiles_gives_the_vnni_loops_bits(ggml_type: int):
    """Where the kernels are built for AMX, the K-quants multiply rows of x on tiles, the sub-scales folded
    into the weights' bytes: W as the A operand below 64 rows of x (6, 16 and 37: the last tile padded),
    as the B operand from 64 (70: rows past a multiple of 16 stay on the vector loop)."""
    kernels = load_cpu_kernels()
    if not kernels.cpu_amx():
        pytest.skip("this build or CPU has no AMX tiles")
    k = 512
    qw = GGUFWeight(_blocks(ggml_type, 40, k, 7), ggml_type, k, int8_activations=True)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(9))
    for rows in (6, 16, 37, 70):
        x = _x(rows, k, 8)
        try:
            with torch.inference_mode():
                tiles = qw.apply(x, bias)
                assert kernels.cpu_amx(False) is False
                vector = qw.apply(x, bias)
        finally:
            kernels.cpu_amx(True)
        assert torch.equal(tiles, vector), rows


@needs_kernels
def test_tram_cpu_amx_0_keeps_the_tiles_off():
    """The loaded kernels follow TRAM_CPU_AMX (a fresh process: the switch is read when they load)."""
    probe = "from tram.model.kernels.cpu_kernels import load_cpu_kernels; print(load_cpu_kernels().cpu_amx())"
    env = {**os.environ, "TRAM_CPU_AMX": "0"}
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split()[-1] == "False"
    env["TRAM_CPU_AMX"] = "1"
    on = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert on.stdout.split()[-1] == str(load_cpu_kernels().cpu_amx())


def test_without_the_kernels_the_int8_reference_runs(monkeypatch):
    qw = GGUFWeight(_blocks(Q4_K, 64, 256, 3), Q4_K, 256, int8_activations=True)
    x = torch.randn(2, 256)
    monkeypatch.setattr(weights, "kernels_for", lambda x: None)
    with torch.inference_mode():
        assert torch.equal(qw.apply(x, None), reference_linear_int8(x, qw, None))


def test_the_setting_is_for_gguf_files_only():
    import argparse

    from tram.config.engine_args import EngineArgs

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    assert (
        EngineArgs.from_cli_args(parser.parse_args(["m.gguf", "--gguf-activations", "int8"])).gguf_activations == "int8"
    )
    assert EngineArgs.from_cli_args(parser.parse_args(["m.gguf"])).gguf_activations == "float32"
    with pytest.raises(ValueError, match="gguf_activations 'int8' applies to GGUF files"):
        EngineArgs(model="some/float-model", gguf_activations="int8").validate()
    with pytest.raises(ValueError, match="gguf_activations 'int4' is not supported"):
        EngineArgs(model="m.gguf", gguf_activations="int4").validate()
    assert GGUFWeight(_blocks(Q8_0, 2, 64, 0), Q8_0, 64).int8_activations is False


@needs_kernels
@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_in_one_call_are_the_separate_calls_bit_for_bit(dtype: torch.dtype, int8: bool):
    """linear_n's q/k/v (gguf_linear_int8_n, gguf_linear_n for float activations): every weight's rows in
    one parallel region (with int8, x quantized once), each output as its own call gives it; with int8
    other types and the GEMM's row counts call each, with float activations more rows than the row kernel's."""
    from tram.model.layers.linear import Linear, linear_n

    k = 512
    for types in ((Q4_K, Q4_K, Q6_K), (Q4_K, Q8_0, Q5_K)):
        layers = []
        for i, (t, n) in enumerate(zip(types, (96, 40, 33), strict=True)):
            layer = Linear(k, n, bias=i == 1, dtype=dtype)
            layer.quant = GGUFWeight(_blocks(t, n, k, 10 + i), t, k, int8_activations=int8)
            if layer.bias is not None:
                layer.bias.data = torch.randn(n, generator=torch.Generator().manual_seed(i)).to(dtype)
            layers.append(layer)
        for rows in (1, 3, 15, 20):  # 20: the repacked GEMM's rows
            x = _x(rows, k, rows).to(dtype)
            with torch.inference_mode():
                together = linear_n(x, layers)
                alone = [layer(x) for layer in layers]
            assert len(together) == 3
            for got, want in zip(together, alone, strict=True):
                assert got.dtype == dtype and torch.equal(got, want)


@needs_kernels
def test_qkv_in_one_call_refuses_what_one_call_refuses():
    kernels = load_cpu_kernels()
    data = _blocks(Q4_K, 8, 256, 1)
    with pytest.raises(RuntimeError, match="rows of"):
        kernels.gguf_linear_int8_n(torch.randn(1, 256), [data, data[:, :-1].contiguous()], [Q4_K, Q4_K], [None, None])
    with pytest.raises(RuntimeError, match="as many"):
        kernels.gguf_linear_int8_n(torch.randn(1, 256), [data], [Q4_K, Q4_K], [None])
    with pytest.raises(RuntimeError, match="rows of"):
        kernels.gguf_linear_n(torch.randn(1, 256), [data, data[:, :-1].contiguous()], [Q4_K, Q4_K], [None, None])
    with pytest.raises(RuntimeError, match="as many"):
        kernels.gguf_linear_n(torch.randn(1, 256), [data], [Q4_K, Q4_K], [None])
    with pytest.raises(RuntimeError, match="bias must be"):
        kernels.gguf_linear_n(torch.randn(1, 256), [data], [Q4_K], [torch.zeros(3)])
