"""All-reduce and all-gather through shared memory, for tensor-parallel ranks on one CPU node.

gloo sends every collective through TCP on loopback, a fixed cost whatever the size, twice per layer
(docs/benchmarks.md, "What one collective costs"). Ranks on one machine can instead write their
tensor into a shared slot, wait until every rank has written, and each read the others' slots: a
memory copy, a spin on a counter and a sum. vLLM and SGLang do this in C++; this one is PyTorch ops
on a mapped file.

The mapped file (in /dev/shm) holds one counter per rank, each on its own cache line, and two
banks of `size` slots. Collective number `seq` uses bank seq % 2: a rank writes its slot, publishes
`seq` in its counter, and waits until every counter reaches `seq`. Two banks are enough: a rank
writes bank b again only at collective seq + 2, after every rank has published seq + 1, which each
does only once it has finished reading bank b for seq. Every rank sums the slots in rank order, so
all ranks get bitwise the same result (the model's residual stream must not drift between ranks).

Ordering: on x86 a store is never seen before the stores that precede it, so the data is in place
when the counter says so. Waiting ranks yield the CPU while they spin: ranks may outnumber cores.
"""

from __future__ import annotations

import mmap
import os
import time
import uuid

import numpy as np
import torch

_LINE = 64  # bytes: one counter per cache line
_HEADER = 4096
DEFAULT_SLOT_BYTES = 8 << 20  # per rank and bank: a [2048, 1024] float32 step of hidden states
WAIT_TIMEOUT_S = 120.0


class ShmCommunicator:
    """Collectives over `size` ranks through a file that every rank maps. Build it with `create` on
    rank 0 and `attach` on the others (the path travels over the process group); tensors larger than
    a slot are not taken (`fits`), and the caller falls back to torch.distributed."""

    def __init__(self, path: str, rank: int, size: int, slot_bytes: int) -> None:
        self.rank, self.size, self.slot_bytes = rank, size, slot_bytes
        total = _HEADER + 2 * size * slot_bytes
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self._counters = np.frombuffer(self._map, dtype=np.int64, count=size * _LINE // 8)[:: _LINE // 8]
        self._data = torch.frombuffer(self._map, dtype=torch.uint8, offset=_HEADER, count=2 * size * slot_bytes)
        self._seq = 0

    @staticmethod
    def create_file(size: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> str:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
        path = os.path.join(folder, f"tram-tp-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _HEADER + 2 * size * slot_bytes)  # zero-filled: every counter starts at 0
        finally:
            os.close(fd)
        return path

    def fits(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.numel() * x.element_size() <= self.slot_bytes

    def _slot(self, bank: int, rank: int, like: torch.Tensor) -> torch.Tensor:
        start = (bank * self.size + rank) * self.slot_bytes
        nbytes = like.numel() * like.element_size()
        return self._data[start : start + nbytes].view(like.dtype).view(like.shape)

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Publish x and wait for every rank's; returns the slots of this collective, in rank order."""
        self._seq += 1
        bank = self._seq % 2
        self._slot(bank, self.rank, x).copy_(x)
        self._counters[self.rank] = self._seq
        self._wait_all(self._seq)
        return [self._slot(bank, r, x) for r in range(self.size)]

    def _wait_all(self, seq: int) -> None:
        counters = self._counters
        if counters.min() >= seq:
            return
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while counters.min() < seq:
            os.sched_yield()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"tensor-parallel ranks {np.nonzero(counters < seq)[0].tolist()} did not reach "
                    f"collective {seq} within {WAIT_TIMEOUT_S:.0f} s"
                )

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over ranks (slot 0 + slot 1 + ..., the same order on every rank), written into x."""
        x = x.contiguous()
        slots = self._exchange(x)
        torch.add(slots[0], slots[1], out=x)
        for slot in slots[2:]:
            x.add_(slot)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' x concatenated along the last dimension, in rank order."""
        return torch.cat(self._exchange(x.contiguous()), dim=-1)

    def close(self) -> None:
        if self._map.closed:
            return
        del self._counters, self._data
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
