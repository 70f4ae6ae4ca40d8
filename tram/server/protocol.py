"""OpenAI request bodies (plus vLLM's extra sampling fields), validated by pydantic.

Anything of the wrong shape fails validation and becomes a 400 with an OpenAI error body. Responses
are built as plain dicts in the serving modules: cheaper than models for every streamed chunk.
"""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tram.sampling_params import RequestOutputKind, SamplingParams

PromptInput = Union[str, list[str], list[int], list[list[int]]]

class StreamOptions(BaseModel):
    include_usage: bool = False

class SamplingFields(BaseModel):
    """Sampling fields common to completions and chat. None means "the model's default".

    `stop`, `stop_token_ids` and `logit_bias` go to `SamplingParams` as the client sent them: it is
    the one place that normalises and validates them (a bad one is a ValueError there, a 400 here).
    """

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=128)  # OpenAI's cap; each sample is a sequence in the batch
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def to_sampling_params(
        self, max_tokens: int | None, defaults: dict[str, Any], logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """Streams get DELTA outputs (each chunk is what is new), the rest one final output.
        ValueError (-> 400) for values SamplingParams rejects."""
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only best_of == n); use n for several samples")

        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, fallback)

        return SamplingParams(
            n=self.n, temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0),
            top_k=pick("top_k", 0), min_p=pick("min_p", 0.0),
            repetition_penalty=pick("repetition_penalty", 1.0),
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, max_tokens=max_tokens, min_tokens=self.min_tokens,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

class CompletionRequest(SamplingFields):
    prompt: PromptInput
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: PromptInput) -> PromptInput:
        # "" tokenizes to just BOS, so without this check it quietly "succeeds" with text that no
        # prompt conditioned; an empty list, or an empty prompt inside a batch, is the same mistake.
        items = [v] if isinstance(v, str) else v
        if not items or any(isinstance(p, (str, list)) and not p for p in items):
            raise ValueError("prompt must not be empty")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
