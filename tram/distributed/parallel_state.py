"""The tensor-parallel group of this process, read by the layers while the model is built.

One process per rank: the worker initialises torch.distributed and sets the group here before it
builds the model, so each layer knows which slice of the weights it owns (as vLLM's
get_tensor_model_parallel_rank/world_size). A process that never calls `init_tensor_parallel`
(the in-process `uni` executor, every test that builds a model directly) is rank 0 of 1.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

# Set to 0 to send CPU collectives through gloo rather than shared memory (to compare them).
SHM_ENV = "TRAM_TP_SHM"


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in its tensor-parallel group; `group` is a torch.distributed group."""

    rank: int = 0
    size: int = 1
    group: Any = None
    # The collectives' implementation (communication.py): "gloo", "nccl" or "shm" (gloo past a slot).
    backend: str = "none"
    shm: Any = None  # a ShmCommunicator on CPU ranks of one node


_TP = TensorParallel()


def get_tp() -> TensorParallel:
    return _TP


def set_tp(tp: TensorParallel) -> None:
    global _TP
    _TP = tp


def init_tensor_parallel(rank: int, size: int, init_method: str, device_type: str,
                         timeout_s: float = 600.0) -> TensorParallel:
    """Join the process group (gloo on CPU, NCCL on CUDA) and make it this process's TP group."""
    import torch.distributed as dist

    backend = "nccl" if device_type == "cuda" else "gloo"
    if size == 1:
        return get_tp()
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    shm = None
    if device_type == "cpu" and os.environ.get(SHM_ENV, "1") != "0":
        shm = _open_shm(rank, size)
        backend = "shm"
    tp = TensorParallel(rank, size, dist.group.WORLD, backend, shm)
    set_tp(tp)
    return tp


def _open_shm(rank: int, size: int) -> Any:
    """Rank 0 creates the shared file and tells the others its path; it is unlinked once all have
    mapped it, so nothing is left in /dev/shm whichever way the processes end."""
    import torch.distributed as dist

    from tram.distributed.shm_comm import DEFAULT_SLOT_BYTES, ShmCommunicator

    path = [ShmCommunicator.create_file(size) if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    comm = ShmCommunicator(path[0], rank, size, DEFAULT_SLOT_BYTES)
    dist.barrier()
    if rank == 0:
        os.unlink(path[0])
    return comm


def destroy_tensor_parallel() -> None:
    import torch.distributed as dist

    if _TP.shm is not None:
        _TP.shm.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    set_tp(TensorParallel())


def shard_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """(start, length) of rank's even share of `total` items; ValueError when they do not divide."""
    if total % size:
        raise ValueError(f"{total} does not split evenly over {size} tensor-parallel ranks")
    share = total // size
    return rank * share, share


def kv_head_range(num_heads: int, num_kv_heads: int, rank: int, size: int) -> tuple[int, int]:
    """(first KV head, count) that rank's query heads attend with. With more ranks than KV heads, each
    KV head is replicated on size // num_kv_heads ranks (as vLLM shards Llama)."""
    if num_kv_heads >= size:
        return shard_range(num_kv_heads, rank, size)
    if size % num_kv_heads:
        raise ValueError(f"{size} tensor-parallel ranks cannot share {num_kv_heads} KV heads: one must divide "
                         "the other")
    q_start, _ = shard_range(num_heads, rank, size)
    return q_start // (num_heads // num_kv_heads), 1
