"""Checks shared by the C++ kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import torch


def assert_batch_and_thread_invariant(apply: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """apply(x) row by row, on a slice, and with one thread equals apply(x) on the whole batch, bit
    for bit: what the kernels promise so that batching never changes a request's output."""
    threads = torch.get_num_threads()
    with torch.inference_mode():
        together = apply(x)
        for i in range(x.shape[0]):
            assert torch.equal(apply(x[i : i + 1]), together[i : i + 1])
        assert torch.equal(apply(x[2:7]), together[2:7])
        torch.set_num_threads(1)
        try:
            assert torch.equal(apply(x), together)
        finally:
            torch.set_num_threads(threads)


def assert_close_to_reference(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """A kernel's output against its PyTorch reference: float32 may differ by summation order only
    (1e-5 of the output's scale), bfloat16 by one rounding of the output (2e-2)."""
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), atol=tol * scale, rtol=tol)


def assert_slabs_match(monkeypatch, qw, x: torch.Tensor, bias: torch.Tensor | None, slab_rows: int) -> None:
    """qw.apply on bfloat16 or float32 x (at least slab_gemm.MIN_ROWS rows), through slab_gemm.py's
    slabs of `slab_rows` weight rows whatever the CPU (slabs forced on for both dtypes: where bf16 GEMMs
    are not native, PyTorch still runs them, slowly). Each slab's outputs from its own rows and bias: a
    slab that read another's would be off by the weights' scale, far past the tolerance."""
    from tram.model.quant import slab_gemm
    from tram.model.quant.weights import reference_linear

    monkeypatch.setattr(slab_gemm, "bf16_gemm_fast", lambda: True)
    monkeypatch.setattr(slab_gemm, "float32_gemm_faster", lambda kernels: True)
    monkeypatch.setattr(slab_gemm, "SLAB_WEIGHTS", slab_rows * qw.in_features)
    monkeypatch.setattr(slab_gemm, "MIN_ROWS_MANY_SLABS", x.shape[0])  # several slabs at x's rows
    slabs = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(
        slab_gemm.F, "linear", lambda a, w, b=None: slabs.append((w.shape[0], w.dtype)) or real(a, w, b)
    )
    with torch.inference_mode():
        got = qw.apply(x, bias)
    monkeypatch.undo()  # F.linear is torch's own: the reference below must not count
    with torch.inference_mode():
        want = reference_linear(x, qw, bias)
    assert slabs and max(n for n, _ in slabs) == slab_rows and sum(n for n, _ in slabs) == qw.out_features, slabs
    assert {dtype for _, dtype in slabs} == {x.dtype}, slabs
    assert_close_to_reference(got, want, x.dtype)
