"""What every OpenAI endpoint shares: the engine, the served model names, defaults and prompt rules."""

from __future__ import annotations

import time
import uuid
from typing import Any

from transformers import GenerationConfig

from tram.engine.async_llm import AsyncLLM
from tram.engine.input_processor import LengthRule
from tram.outputs import PromptLogprobs
from tram.server.handlers.tokenizer_threads import TokenizerThreads, check_token_count
from tram.server.protocol.errors import APIError

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
    """Tokenizing and rendering chat templates run on `threads`, never on the event loop: a long
    prompt must not stall every other client and /health (tokenizer_threads.py)."""

    def __init__(
        self,
        engine: AsyncLLM,
        served_model_names: list[str],
        chat_template: str | None = None,
        threads: TokenizerThreads | None = None,
    ) -> None:
        self.threads = threads or TokenizerThreads()
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

    async def tokenize(
        self,
        text: str,
        add_special_tokens: bool = True,
        check_length: bool = True,
        rule: LengthRule = PROMPT_LENGTH_RULE,
    ) -> list[int]:
        """Token ids of a prompt; with `check_length`, a text that provably cannot fit is refused first."""
        if self.tokenizer is None:
            raise APIError(400, "This server has no tokenizer; send token ids")
        if check_length:  # at once, before the text waits for a thread
            self.engine.input_processor.check_text_length(len(text), rule)
        return await self.threads.run(len(text), self._tokenize_now, text, add_special_tokens, check_length, rule)

    def _tokenize_now(self, text: str, add_special_tokens: bool, check_length: bool, rule: LengthRule) -> list[int]:
        if check_length:
            self.check_fits(text, rule)
        return self.engine.input_processor.tokenize(text, add_special_tokens, False, rule)

    def check_fits(self, text: str, rule: LengthRule) -> None:
        """On a tokenizer thread: PromptTooLongError for a text that cannot fit in the context, known
        by its length in characters, else (a long one) by the tokens of its first pieces."""
        self.engine.input_processor.check_text_length(len(text), rule)
        check_token_count(self.tokenizer, text, self.max_model_len, rule)

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
