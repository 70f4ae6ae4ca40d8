"""Host-to-device copies of per-step inputs that do not stall the host."""

from __future__ import annotations

import numpy as np
import torch


def to_device(values: list | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """On CUDA, stage through pinned memory and copy without blocking, so building the next
    inputs overlaps the copy; the caching host allocator keeps the pinned buffer alive until the copy
    has finished. Elsewhere, a plain tensor."""
    pin = device.type == "cuda"
    if isinstance(values, np.ndarray):
        host = torch.from_numpy(values).to(dtype)
        host = host.pin_memory() if pin else host
    else:
        host = torch.tensor(values, dtype=dtype, pin_memory=pin)
    return host.to(device, non_blocking=pin)
