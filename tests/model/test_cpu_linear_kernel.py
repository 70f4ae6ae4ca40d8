"""The C++ skinny linear kernel (tram/model/kernels/csrc/skinny_linear.cpp) and the routing in
tram/model/layers/linear.py.

Against a float64 reference: shapes whose K and N are not multiples of the kernel's chunks (16 or 32
columns, four rows of x per tile), with and without bias. Each row's result must be bitwise the same
alone or in any batch, and with one or two threads. The kernel must build here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tram.model.kernels import cpu_kernels
from tram.model.kernels.cpu_kernels import load_cpu_kernels, skinny_linear
from tram.model.layers.linear import SKINNY_MAX_ROWS, Linear, linear, linear_n

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # relative to |ref| + 1
SHAPES = [
    (1, 1, 1),
    (1, 7, 5),
    (2, 3, 16),
    (3, 65, 33),
    (4, 64, 32),
    (5, 130, 100),
    (7, 97, 64),
    (8, 288, 288),
    (9, 33, 95),
    (16, 40, 768),
]


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build (see the warning log)"


def make(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_reference(shape: tuple[int, int, int], with_bias: bool, dtype: torch.dtype) -> None:
    x, w, b = make(*shape, dtype)
    bias = b if with_bias else None
    y = skinny_linear(x, w, bias)
    assert y.shape == (shape[0], shape[1]) and y.dtype == dtype
    ref = x.double() @ w.double().T + (b.double() if with_bias else 0)
    err = ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < TOLERANCES[dtype], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_independent_of_batch_and_threads(dtype: torch.dtype) -> None:
    x, w, b = make(11, 300, 288, dtype, seed=1)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batched = skinny_linear(x, w, b)
        torch.set_num_threads(1)
        assert torch.equal(skinny_linear(x, w, b), batched)
    finally:
        torch.set_num_threads(old)
    for i in range(x.shape[0]):
        assert torch.equal(skinny_linear(x[i : i + 1], w, b)[0], batched[i])
    # The same rows in another order and another company.
    perm = torch.tensor([5, 0, 10, 3])
    assert torch.equal(skinny_linear(x[perm], w, b), batched[perm])


def test_non_contiguous_input_and_empty_batch() -> None:
    x, w, b = make(6, 50, 40, torch.float32)
    strided = x[::2]
    assert torch.equal(skinny_linear(strided, w, b), skinny_linear(strided.contiguous(), w, b))
    empty = skinny_linear(x[:0], w, b)
    assert empty.shape == (0, 50)


def test_bad_arguments_raise() -> None:
    x, w, b = make(2, 8, 16, torch.float32)
    with pytest.raises(RuntimeError, match="columns"):
        skinny_linear(x[:, :15], w)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        skinny_linear(x, w.bfloat16())
    with pytest.raises(RuntimeError, match="contiguous"):
        skinny_linear(x, w.T.contiguous().T)
    with pytest.raises(RuntimeError, match="bias"):
        skinny_linear(x, w, b[:3])
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        skinny_linear(x.half(), w.half())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_linear_routes_by_rows(dtype: torch.dtype) -> None:
    limit = SKINNY_MAX_ROWS[dtype]
    x, w, b = make(limit + 1, 70, 48, dtype)
    with torch.inference_mode():
        assert torch.equal(linear(x[:limit], w, b), skinny_linear(x[:limit], w, b))
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))  # past the limit: PyTorch's GEMM
    # With autograd on, the kernel (which has no backward) is never used.
    xg = x[:1].clone().requires_grad_(True)
    out = linear(xg, w, b)
    assert out.requires_grad and torch.equal(out.detach(), F.linear(x[:1], w, b))


def test_linear_module_keeps_nn_linear_parameters() -> None:
    layer = Linear(48, 20, bias=True)
    assert isinstance(layer, torch.nn.Linear)
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}
    x = torch.randn(2, 48)
    with torch.inference_mode():
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-6)
        assert layer(x[:0]).shape == (0, 20)


def test_env_switch_falls_back_to_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")
    cpu_kernels._reset_for_tests()
    try:
        x, w, b = make(2, 30, 20, torch.float32)
        with torch.inference_mode():
            assert torch.equal(linear(x, w, b), F.linear(x, w, b))
        with pytest.raises(RuntimeError, match="not available"):
            skinny_linear(x, w, b)
    finally:
        monkeypatch.delenv(cpu_kernels.ENV_SWITCH)
        cpu_kernels._reset_for_tests()
    assert load_cpu_kernels() is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_several_weights_in_one_call_equal_separate_calls(dtype: torch.dtype) -> None:
    kernels = load_cpu_kernels()
    x, _, _ = make(3, 1, 40, dtype)
    weights = [make(1, n, 40, dtype, seed=n)[1] for n in (17, 5, 70)]
    biases = [torch.randn(17).to(dtype), None, torch.randn(70).to(dtype)]
    outs = kernels.skinny_linear_n(x, weights, biases)
    assert [o.shape for o in outs] == [(3, 17), (3, 5), (3, 70)]
    for out, w, b in zip(outs, weights, biases):
        assert torch.equal(out, skinny_linear(x, w, b))
    layers = [Linear(40, n, bias=True, dtype=dtype) for n in (8, 3)]
    with torch.inference_mode():
        fused = linear_n(x, layers)
        assert all(torch.equal(f, layer(x)) for f, layer in zip(fused, layers))
    big = torch.randn(SKINNY_MAX_ROWS[dtype] + 1, 40).to(dtype)  # past the limit: one F.linear each
    with torch.inference_mode():
        assert all(
            torch.equal(f, F.linear(big, layer.weight, layer.bias)) for f, layer in zip(linear_n(big, layers), layers)
        )
    with pytest.raises(RuntimeError, match="one bias"):
        kernels.skinny_linear_n(x, weights, biases[:2])


def test_the_build_target_is_named_by_tram_cpu_march(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_kernels.MARCH_VAR, raising=False)
    native = cpu_kernels.extension_name()
    assert cpu_kernels.target_arch() == "native"
    monkeypatch.setenv(cpu_kernels.MARCH_VAR, "x86-64-v3")
    assert cpu_kernels.target_arch() == "x86-64-v3"
    assert cpu_kernels.extension_name() != native  # two targets never share a cached build
    monkeypatch.setenv(cpu_kernels.MARCH_VAR, "native -O0")
    with pytest.raises(ValueError, match="TRAM_CPU_MARCH"):
        cpu_kernels.target_arch()
