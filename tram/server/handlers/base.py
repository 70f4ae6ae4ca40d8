"""What every OpenAI endpoint shares: the engine, the served model names, defaults and prompt rules."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from transformers import GenerationConfig

from tram.engine.async_llm import AsyncLLM
from tram.engine.input_processor import LengthRule
from tram.outputs import PromptLogprobs
from tram.server.protocol.errors import APIError

T = TypeVar("T")

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


def prompt_logprobs_json(prompt_logprobs: PromptLogprobs | None) -> list[dict[str, dict] | None] | None:
    """vLLM's `prompt_logprobs` in a response: per prompt position (the first has none), token id
    -> {logprob, rank, decoded_token}."""
    if prompt_logprobs is None:
        return None
    return [
        None
        if row is None
        else {
            str(t): {"logprob": json_logprob(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in row.items()
        }
        for row in prompt_logprobs
    ]


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
    """Tokenizing and rendering chat templates run on `pool`, never on the event loop: a long prompt
    must not stall every other client and /health (Hugging Face's fast tokenizers release the GIL
    while they encode). One thread, as vLLM's, keeps tokenizations in arrival order."""

    def __init__(
        self,
        engine: AsyncLLM,
        served_model_names: list[str],
        chat_template: str | None = None,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.pool = pool or ThreadPoolExecutor(1, thread_name_prefix="tram-tokenize")
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

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def tokenize(
        self,
        text: str,
        add_special_tokens: bool = True,
        check_length: bool = True,
        rule: LengthRule = PROMPT_LENGTH_RULE,
    ) -> list[int]:
        """Token ids of a prompt; a text whose length alone proves it cannot fit is refused first."""
        if self.tokenizer is None:
            raise APIError(400, "This server has no tokenizer; send token ids")
        processor = self.engine.input_processor
        return await self.off_loop(processor.tokenize, text, add_special_tokens, check_length, rule)

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    @staticmethod
    def created() -> int:
        return int(time.time())
