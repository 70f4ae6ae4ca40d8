"""Tensor-parallel state and collectives: which rank this process is, and how its ranks talk
(torch.distributed; gloo on CPU, NCCL on CUDA). With one rank everything here is a no-op."""
from tram.distributed.parallel_state import (
    TensorParallel, get_tp, init_tensor_parallel, shard_range, destroy_tensor_parallel,
)
from tram.distributed.communication import tp_all_gather, tp_all_reduce

__all__ = ["TensorParallel", "destroy_tensor_parallel", "get_tp", "init_tensor_parallel", "shard_range",
           "tp_all_gather", "tp_all_reduce"]
