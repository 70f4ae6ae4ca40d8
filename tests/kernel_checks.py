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
            assert torch.equal(apply(x[i:i + 1]), together[i:i + 1])
        assert torch.equal(apply(x[2:7]), together[2:7])
        torch.set_num_threads(1)
        try:
            assert torch.equal(apply(x), together)
        finally:
            torch.set_num_threads(threads)
