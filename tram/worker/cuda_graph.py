"""CUDA graphs for decode-only steps.

A decode step of B requests launches hundreds of small kernels; on a GPU the launch overhead alone
can exceed the work. At start-up we capture one graph per bucket of batch sizes over the persistent
batch's own device buffers (tram/worker/step_inputs.py, block_table.py); a later decode step of
T <= B tokens has already written its inputs there, so the runner only pads the rest and replays
the bucket's graph.

Padding rows are harmless by construction: their slot is -1 (the cache write skips them) and their
context length is 0 (attention reads no KV for them); their outputs are dropped. The Triton backend's
launch grids depend only on (tokens, requests, splits), all fixed per bucket, and the split count is
chosen for the longest possible context, because each split sizes its share of the context from
seq_lens on the device at replay time.

With `use_graphs=False` the runner replays eagerly over the same padded buffers, which is how the
padding and bucketing are tested on machines without CUDA.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch

from tram.model.attention.base import AttentionMetadata
from tram.model.attention.triton_backend import choose_num_splits
from tram.worker.block_table import BlockTable
from tram.worker.step_inputs import StepBuffers

logger = logging.getLogger(__name__)

ModelFn = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata], torch.Tensor]


def capture_sizes(max_batch: int) -> list[int]:
    """vLLM-style buckets: 1, 2, 4, 8, then every 8 up to max_batch (which is always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeGraphRunner:
    def __init__(
        self,
        model: ModelFn,
        kv_caches: list[torch.Tensor],
        buffers: StepBuffers,
        block_table: BlockTable,
        max_batch: int,
        max_model_len: int,
        num_kv_heads: int,
        use_graphs: bool = True,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_batch)
        self.max_model_len = max_model_len
        self.num_kv_heads = num_kv_heads
        self.use_graphs = use_graphs
        dev = buffers.dev
        self.input_ids = dev["input_ids"]
        self.positions = dev["positions"]
        self.slot_mapping = dev["slot_mapping"]
        self.seq_lens = dev["seq_lens"]
        self.query_start_loc = dev["query_start_loc"]
        self.block_tables = block_table.gpu
        self._offsets = torch.arange(self.sizes[-1] + 1, dtype=torch.int32, device=self.query_start_loc.device)
        self._pad(0, self.sizes[-1])  # capture sees only padding rows
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, torch.Tensor | None]] = {}

    def _pad(self, num: int, size: int) -> None:
        """Rows num..size-1 become padding: slot -1 (the cache write skips them), context length 0
        (attention reads no KV for them), and one query token each."""
        self.slot_mapping[num:size].fill_(-1)
        self.seq_lens[num:size].fill_(0)
        self.query_start_loc[num + 1 : size + 1].copy_(self._offsets[num + 1 : size + 1])

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=size,
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            query_lens_list=[1] * size,
            seq_lens_list=[self.max_model_len] * size,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            num_padded_reqs=size,
            num_splits=choose_num_splits(size, self.num_kv_heads, 1, self.max_model_len),
        )

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, self._meta(size))

    def capture(self) -> float:
        """Capture every bucket, largest first so smaller graphs reuse its memory pool; return seconds."""
        start = time.perf_counter()
        if not self.use_graphs:
            self.graphs = {size: (None, None) for size in self.sizes}
            return 0.0
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up: Triton compiles and autotunes outside capture
                self._forward(self.sizes[-1])
        torch.cuda.current_stream().wait_stream(stream)
        for size in reversed(self.sizes):
            self._forward(size)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(size)
            self.graphs[size] = (graph, out)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def can_run(self, meta: AttentionMetadata) -> bool:
        return bool(self.graphs) and meta.max_query_len == 1 and meta.num_tokens <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, hidden] of a decode-only step of T tokens (T requests)."""
        num = meta.num_tokens
        size = self.sizes[bisect.bisect_left(self.sizes, num)]
        # The persistent batch writes the step's inputs into these buffers already; copy only
        # inputs that came from elsewhere.
        for dst, src in (
            (self.input_ids, input_ids),
            (self.positions, positions),
            (self.slot_mapping, meta.slot_mapping),
            (self.seq_lens, meta.seq_lens),
        ):
            if src.data_ptr() != dst.data_ptr():
                dst[:num].copy_(src, non_blocking=True)
        if meta.block_tables.data_ptr() != self.block_tables.data_ptr():
            self.block_tables[:num, : meta.block_tables.shape[1]].copy_(meta.block_tables, non_blocking=True)
        self._pad(num, size)
        graph, out = self.graphs[size]
        if graph is None:
            return self._forward(size)[:num]
        graph.replay()
        return out[:num]
