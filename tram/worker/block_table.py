"""The persistent batch's block table: one row of KV block ids per batch row, grown by appends.

Rows live in a host array [max_num_reqs, max_blocks_per_req]; a step changes only the ids the
scheduler just handed out. The device copy is the same memory on CPU and a persistent buffer on
CUDA that a step refreshes with one copy of the live rows (CUDA graphs read it in place).
"""

from __future__ import annotations

import numpy as np
import torch


class BlockTable:
    def __init__(self, max_num_reqs: int, max_blocks_per_req: int, device: torch.device) -> None:
        self.max_blocks_per_req = max_blocks_per_req
        self.device = device
        pin = device.type == "cuda"
        self.host = torch.zeros((max_num_reqs, max_blocks_per_req), dtype=torch.int32, pin_memory=pin)
        self.np = self.host.numpy()  # same memory, for cheap host-side writes
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.gpu = self.host if device.type == "cpu" else torch.zeros_like(self.host, device=device)

    def set_row(self, row: int, block_ids: list[int]) -> None:
        n = len(block_ids)
        self.np[row, :n] = block_ids
        self.num_blocks[row] = n

    def append(self, row: int, block_ids: list[int]) -> None:
        if block_ids:
            start = int(self.num_blocks[row])
            self.np[row, start : start + len(block_ids)] = block_ids
            self.num_blocks[row] = start + len(block_ids)

    def move_row(self, src: int, dst: int) -> None:
        n = int(self.num_blocks[src])
        self.np[dst, :n] = self.np[src, :n]
        self.num_blocks[dst] = n

    def row(self, row: int) -> np.ndarray:
        return self.np[row, : self.num_blocks[row]]

    def commit(self, num_reqs: int) -> torch.Tensor:
        """The live rows on the device, [num_reqs, max_blocks_per_req] (one copy on CUDA, none on CPU)."""
        if self.gpu is not self.host:
            self.gpu[:num_reqs].copy_(self.host[:num_reqs], non_blocking=True)
        return self.gpu[:num_reqs]
