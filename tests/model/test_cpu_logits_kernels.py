"""The C++ kernels on the logits' path, against the PyTorch ops they replace, exactly.

argmax_rows (csrc/argmax.cpp) must answer as torch.argmax(dim=-1): the first index of the maximum,
the first NaN where a row holds one, index 0 for an all -inf row; greedy decoding and the
exponential-race draw both take their token from it. widen_to_float (csrc/widen.cpp) must equal
.float() bit for bit: the LM head's 16-bit logits become the sampler's float32 logits through it."""

from __future__ import annotations

import pytest
import torch

from tram.model.kernels.cpu_kernels import argmax_rows, load_cpu_kernels, to_float32
from tram.worker.sampler import exponential_race

# Row lengths around the kernel's 64-float vector step and tail, and real vocabularies.
LENGTHS = [1, 7, 63, 64, 65, 100, 128, 1000, 32000, 32001, 151936]


@pytest.fixture(scope="module")
def kernels():
    module = load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build (see the warning log)"
    return module


def check(kernels, x: torch.Tensor) -> None:
    got = kernels.argmax_rows(x)
    assert got.dtype == torch.int64 and got.shape == (x.shape[0],)
    assert torch.equal(got, x.argmax(dim=-1))


@pytest.mark.parametrize("n", LENGTHS)
def test_random_rows(kernels, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    check(kernels, torch.randn(9, n, generator=g))


@pytest.mark.parametrize("n", [5, 64, 65, 130, 1000, 32000])
def test_ties_take_the_first_index(kernels, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g)
    for r in range(6):  # the maximum repeated in different lanes, accumulators and the tail
        idx = torch.randperm(n, generator=g)[: min(n, 2 + r)]
        x[r, idx] = 10.0
    check(kernels, x)
    # Identical rows: every position ties.
    check(kernels, torch.full((3, n), 0.5))


@pytest.mark.parametrize("n", [3, 64, 97, 32000])
def test_nan_and_infinities(kernels, n: int) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, n, generator=g)
    x[0, n // 2] = float("nan")  # NaN wins over everything, even +inf
    x[0, n - 1] = float("inf")
    x[1, :] = float("-inf")  # no finite value: index 0
    x[2, n - 1] = float("inf")  # +inf in the tail
    x[3, 0] = float("inf")
    x[4, n - 1] = float("nan")  # a NaN only in the last position
    x[5, : n // 2] = float("-inf")
    check(kernels, x)


def test_signed_zeros_tie(kernels) -> None:
    x = torch.full((2, 200), -1.0)
    x[0, 70], x[0, 3] = 0.0, -0.0
    x[1, 3], x[1, 70] = 0.0, -0.0
    check(kernels, x)


def test_strided_rows_and_empty_batch(kernels) -> None:
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(8, 500, generator=g)
    check(kernels, wide[:, 100:400])  # row stride 500, last dim contiguous
    check(kernels, wide[::2])  # every other row
    check(kernels, wide.t().contiguous().t()[:, :300])  # column-major: copied first
    check(kernels, torch.empty(0, 32))


def test_argmax_rows_falls_back_where_the_kernel_does_not_apply() -> None:
    x = torch.randn(4, 300)
    with torch.inference_mode():
        assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
        for other in (x.bfloat16(), x.double(), x[0]):
            assert torch.equal(argmax_rows(other), other.argmax(dim=-1))
    y = torch.randn(4, 300, requires_grad=True)  # autograd on: torch's own argmax
    assert torch.equal(argmax_rows(y), y.argmax(dim=-1))


def test_kernel_rejects_bad_input(kernels) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        kernels.argmax_rows(torch.randn(2, 8).double())
    with pytest.raises(RuntimeError, match="zero logits"):
        kernels.argmax_rows(torch.empty(2, 0))


def test_exponential_race_still_follows_its_generator() -> None:
    # The race's argmax now goes through the kernel: a seeded row must draw the same token as the
    # same computation through torch.argmax.
    probs = torch.softmax(torch.randn(3, 1000, generator=torch.Generator().manual_seed(3)), dim=-1)
    with torch.inference_mode():
        got = exponential_race(probs, {1: torch.Generator().manual_seed(7)})
    noise = torch.empty(1000).uniform_(generator=torch.Generator().manual_seed(7))
    noise = (-(1 - noise).log()).clamp_min(torch.finfo(torch.float32).tiny)
    assert got[1].item() == (probs[1] / noise).argmax().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(0, 5), (1, 7), (3, 32000), (65537,), (2, 3, 9)])
def test_widen_to_float_is_the_exact_cast(kernels, dtype, shape) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(*shape, generator=g) * 1e3).to(dtype)
    if x.numel() > 4:
        x.view(-1)[:4] = torch.tensor([float("inf"), float("-inf"), -0.0, float("nan")], dtype=dtype)
    got = kernels.widen_to_float(x)
    want = x.float()
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(got.isnan(), want.isnan())  # a NaN's payload may differ
    finite = ~want.isnan()
    assert torch.equal(got.view(torch.int32)[finite], want.view(torch.int32)[finite])  # -0.0 included


def test_widen_to_float_copies_strided_input_and_passes_float32_through(kernels) -> None:
    x = torch.randn(6, 40).bfloat16()
    assert torch.equal(kernels.widen_to_float(x[:, ::3]), x[:, ::3].float())
    y = torch.randn(3, 3)
    assert kernels.widen_to_float(y).data_ptr() == y.data_ptr()  # float32 passes through, no copy
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        kernels.widen_to_float(torch.ones(3, dtype=torch.int32))


def test_to_float32_falls_back_where_the_kernel_does_not_apply() -> None:
    x = torch.randn(4, 9).bfloat16()
    with torch.inference_mode():
        assert torch.equal(to_float32(x), x.float())
        assert torch.equal(to_float32(x.double()), x.double().float())
    z = torch.randn(4, 9, requires_grad=True)
    assert to_float32(z) is z
    w = torch.randn(4, 9, dtype=torch.bfloat16, requires_grad=True)
    assert torch.equal(to_float32(w), w.float())  # autograd on: torch's cast
