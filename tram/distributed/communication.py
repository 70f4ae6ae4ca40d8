"""The two collectives tensor parallelism needs, over this process's TP group.

Row-parallel layers (o_proj, down_proj) and the vocab-parallel embedding sum partial results with
`tp_all_reduce`; the vocab-parallel LM head joins its logit shards with `tp_all_gather`. Both return
their input unchanged with one rank, so single-device code pays nothing. CPU ranks of one node go
through shared memory (shm_comm.py) for every tensor that fits a slot, gloo otherwise.
"""

from __future__ import annotations

import torch

from tram.distributed.parallel_state import get_pp, get_tp


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over the TP ranks (in place where the backend allows; use the result)."""
    tp = get_tp()
    if tp.size == 1:
        return x
    if tp.shm is not None and tp.shm.fits(x):
        return tp.shm.all_reduce(x)
    import torch.distributed as dist

    x = x.contiguous()
    dist.all_reduce(x, group=tp.group)
    return x


def tp_all_gather(x: torch.Tensor) -> torch.Tensor:
    """The ranks' x concatenated along the last dimension, in rank order: [..., n] -> [..., size * n]."""
    tp = get_tp()
    if tp.size == 1:
        return x
    if tp.shm is not None and tp.shm.fits(x):
        return tp.shm.all_gather(x)
    import torch.distributed as dist

    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    return torch.cat(parts, dim=-1)


def pp_send(x: torch.Tensor) -> None:
    """Hand this stage's hidden states to the next stage (the same TP rank there)."""
    import torch.distributed as dist

    dist.send(x.contiguous(), dst=get_pp().next)


def pp_recv(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The previous stage's hidden states for this step."""
    import torch.distributed as dist

    x = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(x, src=get_pp().prev)
    return x
