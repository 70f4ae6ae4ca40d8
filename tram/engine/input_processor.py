"""Validates and tokenizes what users submit, before anything reaches the core."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from tram.sampling_params import SamplingParams

# A prompt: text, {"prompt": text}, or {"prompt_token_ids": [...] (, "prompt": text)}.
PromptType = Union[str, dict[str, Any]]


class PromptTooLongError(ValueError):
    """The prompt (or the prompt plus the completion) does not fit in the context; it carries the
    request field to blame and OpenAI's error code, so the server reports it without re-checking."""

    code = "context_length_exceeded"

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class LengthRule:
    """How a prompt's length is checked. Offline a prompt fits in max_model_len and generation
    stops at the end of the context; the OpenAI server (as vLLM's) also wants room for the whole
    completion, prompt + max_tokens (at least one token when max_tokens is None)."""

    completion_must_fit: bool = False
    prompt_field: str = "prompt"  # the request field an error names ("messages" for chat)


OFFLINE_LENGTH_RULE = LengthRule()


class InputProcessor:
    def __init__(self, tokenizer: Any | None, vocab_size: int, max_model_len: int, max_logprobs: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs

    def process(
        self, prompt: PromptType, params: SamplingParams, length_rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> tuple[str | None, list[int]]:
        """Return (prompt text or None, prompt token ids); raise ValueError on bad input."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids = self._tokenize(prompt)
        if not token_ids:
            raise ValueError("The prompt is empty: it must contain at least one token")
        self.check_prompt_length(len(token_ids), params.max_tokens, length_rule)
        self._validate(token_ids, params)
        return text, token_ids

    def check_prompt_length(
        self, num_prompt_tokens: int, max_tokens: int | None, rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> None:
        """PromptTooLongError unless the prompt (and, by `rule`, the completion) fits."""
        limit, what = self.max_model_len, rule.prompt_field
        if num_prompt_tokens > limit:
            verb = "are" if what.endswith("s") else "is"
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, your {what} (length "
                f"{num_prompt_tokens}) {verb} longer than the maximum model length of {limit}. "
                f"Please reduce the length of the {what}.", what,
            )
        if not rule.completion_must_fit:
            return
        completion = 1 if max_tokens is None else max_tokens
        if num_prompt_tokens + completion > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt_tokens + completion} tokens ({num_prompt_tokens} in the {what}, {completion} "
                f"for the completion), more than the maximum model length. Please reduce the length of "
                f"the {what} or completion.", "max_tokens",
            )

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise ValueError("prompt_token_ids must be a list of integers")
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt must be a string or a dict, got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; this engine was started with skip_tokenizer_init")
        return prompt, list(self.tokenizer.encode(prompt))

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        params.verify_token_ids(self.vocab_size)
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            # As in vLLM, -1 asks for the whole vocabulary and counts as that many.
            num = self.vocab_size if k == -1 else k
            if num is not None and num > self.max_logprobs:
                raise ValueError(
                    f"{name}={k} asks for {num} logprobs, more than the maximum allowed "
                    f"({self.max_logprobs}; raise max_logprobs)"
                )
        # SamplingParams itself rejects stop strings with detokenize=False.
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this engine was started with skip_tokenizer_init")
