"""What every OpenAI endpoint shares: the engine, the served model names, defaults and prompt rules."""
from __future__ import annotations

import time
import uuid
from typing import Any

from transformers import GenerationConfig

from tram.engine.async_llm import AsyncLLM
from tram.engine.input_processor import LengthRule
from tram.server.errors import APIError

# Sampling fields a model's generation_config.json may set as defaults (vLLM's `--generation-config auto`).
_GENERATION_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# As vLLM's server: the prompt and the whole completion must fit in the context (the input
# processor checks it; these name the request field an error blames).
PROMPT_LENGTH_RULE = LengthRule(completion_must_fit=True, prompt_field="prompt")
MESSAGES_LENGTH_RULE = LengthRule(completion_must_fit=True, prompt_field="messages")
# JSON has no -inf; OpenAI and vLLM report impossible tokens at this floor.
_LOGPROB_FLOOR = -9999.0


def json_logprob(logprob: float) -> float:
    return max(logprob, _LOGPROB_FLOOR)


def generation_config_defaults(model_path: str | None) -> dict[str, Any]:
    """Sampling defaults the model's authors chose; only the fields they set explicitly (none for None)."""
    if model_path is None:
        return {}
    try:
        diff = GenerationConfig.from_pretrained(model_path).to_diff_dict()
    except (OSError, ValueError):
        return {}
    return {k: diff[k] for k in _GENERATION_DEFAULT_FIELDS if diff.get(k) is not None}


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, served_model_names: list[str], chat_template: str | None = None) -> None:
        self.engine = engine
        self.served_model_names = served_model_names
        self.model_name = served_model_names[0]
        self.chat_template = chat_template
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.config.scheduler_config.max_model_len
        self.defaults = generation_config_defaults(engine.config.generation_config)  # --generation-config

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "This server has no tokenizer; send token ids")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    @staticmethod
    def created() -> int:
        return int(time.time())
