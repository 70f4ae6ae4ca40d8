"""Tensor- and pipeline-parallel state and communication: which rank this process is, and how its ranks talk
(torch.distributed; gloo on CPU, NCCL on CUDA). With one rank everything here is a no-op."""

from tram.distributed.communication import pp_recv, pp_send, tp_all_gather, tp_all_reduce
from tram.distributed.parallel_state import (
    PipelineParallel,
    TensorParallel,
    destroy_tensor_parallel,
    expert_parallel,
    get_pp,
    get_tp,
    init_parallel,
    init_tensor_parallel,
    set_expert_parallel,
    shard_range,
)

__all__ = [
    "PipelineParallel",
    "TensorParallel",
    "destroy_tensor_parallel",
    "expert_parallel",
    "get_pp",
    "get_tp",
    "init_parallel",
    "init_tensor_parallel",
    "pp_recv",
    "pp_send",
    "set_expert_parallel",
    "shard_range",
    "tp_all_gather",
    "tp_all_reduce",
]
