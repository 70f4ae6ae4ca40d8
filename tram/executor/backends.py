"""The executor backends, registered by name with configuration (EXECUTOR_BACKENDS), and their
up-front checks (Ray installed, one rank for uni). Torch-free, and importing no backend: the API
process validates `--distributed-executor-backend` with it before any engine process starts.
"""

from __future__ import annotations

from typing import Any

from tram.config.registry import EXECUTOR_BACKENDS

RAY_MISSING = (
    "distributed_executor_backend 'ray' needs Ray, which is not installed: pip install 'tram-llm[ray]' "
    "(or use mp on one machine)"
)

EXECUTOR_BACKENDS.add(
    "uni", "in the engine core's process; one rank only", target="tram.executor.uniproc:UniProcExecutor"
)
EXECUTOR_BACKENDS.add("mp", "a process per rank on this machine", target="tram.executor.multiproc:MultiprocExecutor")
EXECUTOR_BACKENDS.add(
    "ray",
    "a Ray actor per rank on the Ray cluster: RAY_ADDRESS, else a local one; pip install 'tram-llm[ray]'",
    target="tram.executor.ray_executor:RayExecutor",
)


def import_ray() -> Any:
    """The ray module; ValueError in one line when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    return ray


@EXECUTOR_BACKENDS.set_default
def default_executor_backend(world_size: int) -> str:
    """The backend when none is named: a process per rank past one rank."""
    return "mp" if world_size > 1 else "uni"


@EXECUTOR_BACKENDS.add_check
def check_executor_backend(name: str, args: Any) -> None:
    """ValueError for an unknown backend, for uni past one rank, and for ray without Ray (now, in one
    line, rather than at start-up)."""
    if name not in EXECUTOR_BACKENDS:
        raise ValueError(
            f"distributed_executor_backend {name!r} is not supported: choose {' or '.join(EXECUTOR_BACKENDS)}"
        )
    ranks = args.tensor_parallel_size * args.pipeline_parallel_size
    if name == "uni" and ranks > 1:
        raise ValueError(
            f"distributed_executor_backend 'uni' runs one rank; tensor_parallel_size "
            f"{args.tensor_parallel_size} x pipeline_parallel_size {args.pipeline_parallel_size} "
            "needs mp"
        )
    if name == "ray":
        import_ray()
