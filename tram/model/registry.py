"""Which class serves which Hugging Face architecture name (config.architectures[0])."""

from __future__ import annotations

from typing import Any

from torch import nn

from tram.distributed import get_pp, get_tp
from tram.distributed.parallel_state import kv_head_range
from tram.model.models.gemma2 import Gemma2ForCausalLM
from tram.model.models.gemma3 import Gemma3ForCausalLM
from tram.model.models.gpt_oss import GptOssForCausalLM
from tram.model.models.granite import GraniteForCausalLM
from tram.model.models.llama import LlamaForCausalLM, MistralForCausalLM
from tram.model.models.mixtral import MixtralForCausalLM
from tram.model.models.olmo2 import Olmo2ForCausalLM
from tram.model.models.phi3 import Phi3ForCausalLM
from tram.model.models.qwen2 import Qwen2ForCausalLM
from tram.model.models.qwen3 import Qwen3ForCausalLM
from tram.model.models.qwen3_moe import Qwen3MoeForCausalLM
from tram.model.models.smollm3 import SmolLM3ForCausalLM
from tram.model.pipeline import layer_range
from tram.model.spec import attention_dims

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(arch: str) -> type[nn.Module]:
    """The model class for an architecture name; ValueError naming the supported ones otherwise."""
    cls = _MODELS.get(arch)
    if cls is None:
        raise ValueError(
            f"Model architecture {arch or '(none given)'} is not supported. "
            f"Supported architectures: {', '.join(supported_architectures())}"
        )
    return cls


def kv_cache_shape_info(hf_config: Any) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim): what the worker needs to size the paged KV cache; the KV
    heads are this tensor-parallel rank's."""
    num_heads, num_kv_heads, head_dim = attention_dims(hf_config)
    tp, pp = get_tp(), get_pp()
    _, local_kv_heads = kv_head_range(num_heads, num_kv_heads, tp.rank, tp.size)
    start, end = layer_range(int(hf_config.num_hidden_layers), pp.rank, pp.size)
    return end - start, local_kv_heads, head_dim
