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


class MultiGroupBlockTable:
    """One BlockTable per KV cache group (kv_cache_groups.py), moved and grown together: a request's
    row is the same in every group; each group holds its own block ids."""

    def __init__(self, num_groups: int, max_num_reqs: int, max_blocks_per_req: int, device: torch.device) -> None:
        self.groups = [BlockTable(max_num_reqs, max_blocks_per_req, device) for _ in range(num_groups)]

    def __getitem__(self, group: int) -> BlockTable:
        return self.groups[group]

    def set_row(self, row: int, block_ids: list[list[int]]) -> None:
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.set_row(row, ids)

    def append(self, row: int, block_ids: list[list[int]]) -> None:
        for table, ids in zip(self.groups, block_ids, strict=True):
            table.append(row, ids)

    def move_row(self, src: int, dst: int) -> None:
        for table in self.groups:
            table.move_row(src, dst)
