"""Whether a model's shape splits over a number of tensor-parallel (or expert-parallel) ranks, checked before anything
loads, with a message that says which dimension does not divide."""

from __future__ import annotations

from typing import Any


def check_tensor_parallel(hf_config: Any, tp: int) -> None:
    """ValueError unless the heads, KV heads and MLP width split evenly over tp ranks."""
    if tp == 1:
        return
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    intermediate = int(hf_config.intermediate_size)
    if heads % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tensor_parallel_size {tp} and the model's {kv_heads} KV heads: one must divide the other")
    if intermediate % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the model's intermediate_size {intermediate}")


def num_experts(hf_config: Any) -> int:
    """The experts per MoE layer a config declares; 0 for a dense model."""
    return int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)


def expert_intermediate_size(hf_config: Any) -> int:
    return int(getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size)


def check_expert_parallel(hf_config: Any, tp: int, enable_expert_parallel: bool) -> None:
    """ValueError unless the experts split over tp ranks: whole experts with expert parallelism,
    each expert's intermediate channels without."""
    experts = num_experts(hf_config)
    if enable_expert_parallel and not experts:
        raise ValueError("enable_expert_parallel is set, but the model has no experts")
    if tp == 1 or not experts:
        return
    if enable_expert_parallel and experts % tp:
        raise ValueError(f"expert-parallel size {tp} does not divide the model's {experts} experts")
    width = expert_intermediate_size(hf_config)
    if not enable_expert_parallel and width % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the experts' intermediate size {width}")
