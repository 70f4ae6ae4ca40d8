"""Whether a model's shape splits over a number of tensor-parallel ranks, checked before anything
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
