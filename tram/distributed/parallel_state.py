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

import tram.envs as envs

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


@dataclass(frozen=True)
class PipelineParallel:
    """This process's pipeline stage; prev/next are the global ranks it receives from and sends to
    (the same tensor-parallel rank of the neighbouring stages)."""

    rank: int = 0
    size: int = 1
    prev: int | None = None
    next: int | None = None

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1


_PP = PipelineParallel()


def get_pp() -> PipelineParallel:
    return _PP


def set_pp(pp: PipelineParallel) -> None:
    global _PP
    _PP = pp


def init_tensor_parallel(
    rank: int, size: int, init_method: str, device_type: str, timeout_s: float = 600.0
) -> TensorParallel:
    """Join a process group of `size` tensor-parallel ranks (no pipeline)."""
    return init_parallel(rank, size, 1, init_method, device_type, timeout_s)[0]


def init_parallel(
    rank: int,
    tp_size: int,
    pp_size: int,
    init_method: str,
    device_type: str,
    timeout_s: float = 600.0,
    shm_ok: bool = True,
) -> tuple[TensorParallel, PipelineParallel]:
    """Join the process group of tp_size * pp_size ranks (gloo on CPU, NCCL on CUDA) and set this
    process's TP group and pipeline stage. Global rank = stage * tp_size + tp_rank: a stage's ranks
    are contiguous (on one node, when ranks fill nodes in order). shm_ok: this rank's TP group is on
    one machine, so its CPU collectives may go through shared memory."""
    import torch.distributed as dist

    world = tp_size * pp_size
    if world == 1:
        return get_tp(), get_pp()
    backend = "nccl" if device_type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
        )
    stage, tp_rank = divmod(rank, tp_size)
    group = dist.group.WORLD
    if pp_size > 1:  # every rank creates every group, in the same order (torch.distributed's rule)
        for s in range(pp_size):
            ranks = list(range(s * tp_size, (s + 1) * tp_size))
            created = dist.new_group(ranks) if tp_size > 1 else None
            if s == stage:
                group = created
    tp = TensorParallel(tp_rank, tp_size, group, backend if tp_size > 1 else "none")
    if tp_size > 1 and device_type == "cpu" and shm_ok and envs.TRAM_TP_SHM:
        tp = TensorParallel(tp_rank, tp_size, group, "shm", _open_shm(tp_rank, tp_size, stage * tp_size, group))
    pp = PipelineParallel(
        stage, pp_size, rank - tp_size if stage > 0 else None, rank + tp_size if stage < pp_size - 1 else None
    )
    set_tp(tp)
    set_pp(pp)
    return tp, pp


def _open_shm(tp_rank: int, size: int, first_rank: int, group: Any) -> Any:
    """The group's first rank creates the shared file and tells the others its path; it is unlinked
    once all have mapped it, so nothing is left in /dev/shm whichever way the processes end."""
    import torch.distributed as dist

    from tram.distributed.shm_comm import DEFAULT_SLOT_BYTES, ShmCommunicator

    path = [ShmCommunicator.create_file(size) if tp_rank == 0 else None]
    dist.broadcast_object_list(path, src=first_rank, group=group)
    comm = ShmCommunicator(path[0], tp_rank, size, DEFAULT_SLOT_BYTES)
    dist.barrier(group=group)
    if tp_rank == 0:
        os.unlink(path[0])
    return comm


# Whether mixture-of-experts layers place whole experts on each rank of the tensor-parallel group
# (vLLM's --enable-expert-parallel) instead of a slice of every expert; set by the worker before
# it builds the model.
_EXPERT_PARALLEL = False


def set_expert_parallel(enabled: bool) -> None:
    global _EXPERT_PARALLEL
    _EXPERT_PARALLEL = enabled


def expert_parallel() -> bool:
    return _EXPERT_PARALLEL


def destroy_tensor_parallel() -> None:
    import torch.distributed as dist

    if _TP.shm is not None:
        _TP.shm.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    set_tp(TensorParallel())
    set_pp(PipelineParallel())
    set_expert_parallel(False)


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
        raise ValueError(
            f"{size} tensor-parallel ranks cannot share {num_kv_heads} KV heads: one must divide the other"
        )
    q_start, _ = shard_range(num_heads, rank, size)
    return q_start // (num_heads // num_kv_heads), 1
