"""Test helpers: tiny random Hugging Face model folders, and paged steps without the engine.

`make_hf_model_dir` writes complete model folders (config, safetensors, the stories260K tokenizer)
with transformers' own classes, so transformers is the numerical oracle. `build_meta` and
`PagedRunner` drive a model through the paged KV cache the way a model runner would.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tram.model.attention.base import AttentionMetadata

STORIES_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "stories260K"))
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "chat_template.jinja",
)

_BASE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
)
# Gemma 3: sliding layers (window 5, shorter than the test prompts) between global ones, each kind of
# layer with its own RoPE (small bases so that rotations differ within a few positions; linear scaling
# on the global ones, as Gemma 3 4B+ has), and an attention scale that is not head_dim ** -0.5.
_GEMMA3: dict[str, Any] = dict(
    head_dim=32,
    query_pre_attn_scalar=24,
    sliding_window=5,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    },
)
# Phi-4-mini: LongRoPE over 3/4 of each head (partial rotary), tied embeddings. The short factors hold
# up to 512 positions (original_max_position_embeddings: a context of 512 or less rotates with them),
# the long ones beyond; a small base, so that rotations differ within a few positions, and long
# factors far from the short ones.
_PHI4_MINI: dict[str, Any] = dict(
    pad_token_id=0,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
    original_max_position_embeddings=512,
    rope_parameters=dict(
        rope_type="longrope",
        rope_theta=100.0,
        partial_rotary_factor=0.75,
        short_factor=[1.0, 1.05, 1.2, 1.5, 1.9, 2.4],
        long_factor=[1.3, 2.0, 3.5, 6.0, 9.0, 14.0],
    ),
)
# kind -> (transformers config class name, overrides of _BASE)
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_gqa": ("LlamaConfig", dict(tie_word_embeddings=True)),
    # head_dim deliberately differs from hidden_size / num_heads.
    "llama_mha": (
        "LlamaConfig",
        dict(num_key_value_heads=4, head_dim=32, num_hidden_layers=3, tie_word_embeddings=True),
    ),
    "qwen2": ("Qwen2Config", dict(num_hidden_layers=3, tie_word_embeddings=False)),
    "llama_untied": ("LlamaConfig", dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    "llama3_rope": (
        "LlamaConfig",
        dict(
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": ("MistralConfig", dict(sliding_window=8, tie_word_embeddings=False)),
    # q/k norms per head; head_dim deliberately differs from hidden_size / num_heads.
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=3, head_dim=32, tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", dict(num_hidden_layers=3, **_GEMMA3)),
    "gemma3_softcap": ("Gemma3TextConfig", dict(num_hidden_layers=3, final_logit_softcapping=10.0, **_GEMMA3)),
    # Fused qkv_proj and gate_up_proj in the checkpoint.
    "phi3": ("Phi3Config", dict(pad_token_id=0, tie_word_embeddings=False)),
    "phi4_mini": ("Phi3Config", _PHI4_MINI),
    # Post-norms, q/k norms over all heads.
    "olmo2": ("Olmo2Config", dict(num_hidden_layers=3, tie_word_embeddings=False)),
    # Multipliers far from 1, an attention scale that is not head_dim ** -0.5 (Granite 3 2B's are 12,
    # 0.22, 1/64 and 8).
    "granite": (
        "GraniteConfig",
        dict(
            embedding_multiplier=6.0,
            residual_multiplier=0.3,
            attention_multiplier=0.2,
            logits_scaling=4.0,
            tie_word_embeddings=True,
        ),
    ),
    # Mixtures of experts: 8 experts, 2 (3) per token, experts narrower than the dense MLP; Qwen3-MoE
    # without renormalisation of the top k, and with a dense MLP in layer 1 (mlp_only_layers).
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            num_hidden_layers=3,
            head_dim=32,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=48,
            norm_topk_prob=False,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        dict(
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=96,
            sliding_window=None,
            tie_word_embeddings=False,
        ),
    ),
    # gpt-oss: sliding (window 5) and full layers alternating, attention sinks, biases everywhere, YaRN
    # (a small base, so that rotations differ within a few positions), a clamp low enough to cut.
    "gpt_oss": (
        "GptOssConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=2,
            intermediate_size=48,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            swiglu_limit=2.0,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=100.0,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                original_max_position_embeddings=128,
                truncate=False,
            ),
            tie_word_embeddings=False,
        ),
    ),
    # Layer 1 of 3 attends without RoPE (no_rope_layers [1, 0, 1]).
    "smollm3": (
        "SmolLM3Config",
        dict(num_hidden_layers=3, no_rope_layer_interval=2, pad_token_id=None, tie_word_embeddings=True),
    ),
    # Gemma 2: Gemma 3's layout without q/k norms, one RoPE (a small base), window 5 (shorter than the
    # test prompts), and soft-caps near the scores' and logits' own sizes, so that tanh bends them.
    "gemma2": (
        "Gemma2Config",
        dict(
            num_hidden_layers=3,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 100.0},
            attn_logit_softcapping=10.0,
            final_logit_softcapping=10.0,
        ),
    ),
}


def make_hf_model_dir(
    tmp_path: str | Path, kind: str, *, seed: int = 0, max_shard_size: str | None = None, **overrides: Any
) -> str:
    """Write a tiny random float32 model of `kind` (see KINDS) under tmp_path; return its folder.

    Every weight is random, norms and biases included, and q/k are large enough that attention is
    far from uniform, so position and mask bugs show in the logits. max_shard_size (e.g. "20KB")
    writes a sharded checkpoint with model.safetensors.index.json.
    """
    import transformers

    config_cls_name, kind_overrides = KINDS[kind]
    config = getattr(transformers, config_cls_name)(**{**_BASE, **kind_overrides, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    suffix = "_sharded" if max_shard_size else ""
    folder = Path(tmp_path) / f"{kind}{suffix}_{seed}"
    save_kwargs: dict[str, Any] = {}
    if max_shard_size:
        save_kwargs["max_shard_size"] = max_shard_size
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:  # transformers 4
        save_kwargs["safe_serialization"] = True
    model.save_pretrained(folder, **save_kwargs)
    for name in _TOKENIZER_FILES:
        if os.path.exists(os.path.join(STORIES_DIR, name)):
            shutil.copy(os.path.join(STORIES_DIR, name), folder / name)
    return str(folder)


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if "norm" in name:
            param.copy_(1.0 + 0.2 * noise)
        elif name.endswith("bias") or param.dim() == 1:  # biases, gpt-oss's sinks
            param.copy_(0.1 * noise)
        elif "embed_tokens" in name:
            param.copy_(0.3 * noise)
        else:  # [out, in]: unit-ish outputs, so q.k spans a few units
            param.copy_(noise * (1.2 / math.sqrt(param.shape[1])))


def hf_logits(model_dir: str, token_ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """transformers' own logits [len(token_ids), vocab] in float32 (eager attention: the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


@dataclass
class StepRequest:
    """One request's share of a step: its block table, tokens already cached, tokens this step."""

    block_table: list[int]
    num_computed: int
    query_len: int


def build_meta(reqs: list[StepRequest], block_size: int, device: str | torch.device = "cpu") -> AttentionMetadata:
    """The AttentionMetadata a model runner would build for these requests (in this order)."""
    slots: list[int] = []
    for r in reqs:
        for pos in range(r.num_computed, r.num_computed + r.query_len):
            slots.append(r.block_table[pos // block_size] * block_size + pos % block_size)
    query_lens = [r.query_len for r in reqs]
    seq_lens = [r.num_computed + r.query_len for r in reqs]
    width = max(len(r.block_table) for r in reqs)
    tables = [r.block_table + [0] * (width - len(r.block_table)) for r in reqs]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return AttentionMetadata(
        num_tokens=len(slots),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        query_lens_list=query_lens,
        seq_lens_list=seq_lens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )


def build_positions(reqs: list[StepRequest], device: str | torch.device = "cpu") -> torch.Tensor:
    positions = [p for r in reqs for p in range(r.num_computed, r.num_computed + r.query_len)]
    return torch.tensor(positions, dtype=torch.long, device=device)


class PagedRunner:
    """Runs a model step by step through a paged KV cache, like the engine's model runner would.

    Blocks are handed out from a shuffled pool, so block tables are non-contiguous, and the cache
    starts full of finite garbage, so reading a slot that was never written shows in the logits.
    """

    def __init__(self, model: Any, hf_config: Any, block_size: int, num_blocks: int = 96, seed: int = 0) -> None:
        from tram.model.registry import kv_cache_shape_info

        num_layers, num_kv_heads, head_dim = kv_cache_shape_info(hf_config)
        gen = torch.Generator().manual_seed(seed)
        dtype = next(model.parameters()).dtype
        self.model = model
        self.block_size = block_size
        self.kv_caches = [
            3 * torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
            for _ in range(num_layers)
        ]
        self.free_blocks = torch.randperm(num_blocks, generator=gen).tolist()
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Feed each (request id, new token ids) in one flattened batch; return each one's logits [q, V]."""
        reqs = []
        for rid, tokens in chunks:
            table = self.tables.setdefault(rid, [])
            computed = self.computed.setdefault(rid, 0)
            while len(table) * self.block_size < computed + len(tokens):
                table.append(self.free_blocks.pop())
            reqs.append(StepRequest(list(table), computed, len(tokens)))
        meta = build_meta(reqs, self.block_size)
        input_ids = torch.tensor([t for _, tokens in chunks for t in tokens], dtype=torch.long)
        with torch.no_grad():
            hidden = self.model(input_ids, build_positions(reqs), self.kv_caches, meta)
            logits = self.model.compute_logits(hidden)
        for rid, tokens in chunks:
            self.computed[rid] += len(tokens)
        return list(logits.split(meta.query_lens_list))
