"""Validates and tokenizes what users submit, before anything reaches the core."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tram.sampling_params import SamplingParamError, SamplingParams

# A prompt: text, {"prompt": text}, or {"prompt_token_ids": [...] (, "prompt": text)}.
PromptType = str | dict[str, Any]


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
    def __init__(
        self,
        tokenizer: Any | None,
        vocab_size: int,
        max_model_len: int,
        max_logprobs: int,
        max_num_seqs: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.max_num_seqs = max_num_seqs

    def process(
        self,
        prompt: PromptType,
        params: SamplingParams,
        length_rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> tuple[str | None, list[int]]:
        """Return (prompt text or None, prompt token ids); raise ValueError on bad input."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids = self._tokenize(prompt, params.truncate_prompt_tokens is None, length_rule)
        if not token_ids:
            raise ValueError("The prompt is empty: it must contain at least one token")
        k = params.truncate_prompt_tokens
        if k is not None and len(token_ids) > k:
            # vLLM's left truncation keeps the end of the prompt, the part nearest the completion.
            # The text no longer matches the tokens, so an echo decodes the tokens instead.
            text, token_ids = None, token_ids[-k:]
        self.check_prompt_length(len(token_ids), params.max_tokens, length_rule)
        self._validate(token_ids, params)
        return text, token_ids

    def check_prompt_length(
        self,
        num_prompt_tokens: int,
        max_tokens: int | None,
        rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> None:
        """PromptTooLongError unless the prompt (and, by `rule`, the completion) fits."""
        limit, what = self.max_model_len, rule.prompt_field
        if num_prompt_tokens > limit:
            verb = "are" if what.endswith("s") else "is"
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, your {what} (length "
                f"{num_prompt_tokens}) {verb} longer than the maximum model length of {limit}. "
                f"Please reduce the length of the {what}.",
                what,
            )
        if not rule.completion_must_fit:
            return
        completion = 1 if max_tokens is None else max_tokens
        if num_prompt_tokens + completion > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt_tokens + completion} tokens ({num_prompt_tokens} in the {what}, {completion} "
                f"for the completion), more than the maximum model length. Please reduce the length of "
                f"the {what} or completion.",
                "max_tokens",
            )

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The most characters one token can stand for: its vocabulary string is at least as long
        (a SentencePiece piece spells its characters, a byte-level BPE token one symbol per byte),
        times a margin for normalisers that fold several characters into one. 0 without a tokenizer."""
        if self.tokenizer is None:
            return 0
        vocab = self.tokenizer.get_vocab()
        return 4 * max((len(piece) for piece in vocab), default=1)

    def check_text_length(self, num_chars: int, rule: LengthRule = OFFLINE_LENGTH_RULE) -> None:
        """PromptTooLongError when `num_chars` characters cannot fit in the context in any
        tokenization: a 20 MB prompt is refused at once instead of after minutes of tokenizing."""
        per_token = self.max_chars_per_token
        if per_token and num_chars > per_token * self.max_model_len:
            what = rule.prompt_field
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"{what} has {num_chars} characters, more than {self.max_model_len} tokens can hold "
                f"(at most {per_token} characters each). Please reduce the length of the {what}.",
                what,
            )

    def tokenize(
        self,
        text: str,
        add_special_tokens: bool = True,
        check_length: bool = True,
        rule: LengthRule = OFFLINE_LENGTH_RULE,
    ) -> list[int]:
        """Token ids of `text`; with `check_length`, refuse first a text too long to fit by its
        character count alone."""
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; this engine was started with skip_tokenizer_init")
        if check_length:
            self.check_text_length(len(text), rule)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _tokenize(self, prompt: PromptType, check_length: bool, rule: LengthRule) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids
                ):
                    raise ValueError("prompt_token_ids must be a list of integers")
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if not isinstance(prompt, str):
            raise ValueError(f"a prompt must be a string or a dict, got {type(prompt).__name__}")
        return prompt, self.tokenize(prompt, check_length=check_length, rule=rule)

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        params.verify_token_ids(self.vocab_size)
        # Each of n sequences is a request of its own; a billion of them would exhaust the memory of
        # the process that fans them out before the engine saw one.
        if self.max_num_seqs is not None and params.n > self.max_num_seqs:
            raise SamplingParamError(
                "n", f"n={params.n} is more sequences than one batch holds (max_num_seqs = {self.max_num_seqs})"
            )
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
