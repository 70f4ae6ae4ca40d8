"""OpenAI request bodies (plus vLLM's extra sampling fields), validated by pydantic.

Anything of the wrong shape fails validation and becomes a 400 with an OpenAI error body. Responses
are built as plain dicts in the handlers (server/handlers/): cheaper than models for every streamed chunk.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tram.sampling_params import SAMPLING_RANGES as RANGES
from tram.sampling_params import RequestOutputKind, SamplingParams
from tram.sampling_params.ranges import SEED, TOKEN_ID
from tram.server.protocol.field_rules import CHAT_RULES, COMPLETION_RULES, check_text, reject_unsupported
from tram.server.protocol.legacy_functions import map_legacy_functions
from tram.server.protocol.structured import StructuredFields
from tram.server.tools.chat import ChatTool, ToolChoice

# Text a tokenizer can encode (no lone surrogates).
Text = Annotated[str, AfterValidator(check_text)]
# Token ids and counts are 64-bit in the engine; JSON integers are not.
TokenId = Annotated[int, Field(**TOKEN_ID.bounds())]
# Prompt ids are checked against the vocabulary, which names the offending ids.
PromptInput = Text | list[Text] | list[int] | list[list[int]]
OPENAI_MAX_N = 128  # OpenAI's cap on n (and best_of); each sample is a sequence in the batch


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(StructuredFields):
    """Sampling fields common to completions and chat. None means "the model's default".

    `stop`, `stop_token_ids` and `logit_bias` go to `SamplingParams` as the client sent them: it is
    the one place that normalises and validates them (a bad one is a ValueError there, a 400 here).
    The bounds are SamplingParams' own (tram/sampling_params/ranges.py), stated for the OpenAPI
    document and so that a value out of 64-bit range is refused while parsing.

    Unknown fields are refused (`extra="forbid"`), and so are known ones Tram does not honour yet
    (field_rules.py): a client never gets unconstrained text for a constraint it asked for. Types
    are strict, as the OpenAPI document states them: `false` is not a token id, nor "3" a count.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, **RANGES["max_tokens"].bounds())
    temperature: float | None = Field(default=None, **RANGES["temperature"].bounds())
    top_p: float | None = Field(default=None, **RANGES["top_p"].bounds())
    n: int = Field(default=1, **RANGES["n"].bounds(high=OPENAI_MAX_N))
    best_of: int | None = Field(default=None, **RANGES["n"].bounds(high=OPENAI_MAX_N))
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    seed: int | None = Field(default=None, **SEED.bounds())
    presence_penalty: float | None = Field(default=None, **RANGES["presence_penalty"].bounds())
    frequency_penalty: float | None = Field(default=None, **RANGES["frequency_penalty"].bounds())
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # OpenAI's end-user id for abuse monitoring: nothing for an engine to do
    # vLLM's extras
    top_k: int | None = Field(default=None, **RANGES["top_k"].bounds())
    min_p: float | None = Field(default=None, **RANGES["min_p"].bounds())
    repetition_penalty: float | None = Field(default=None, **RANGES["repetition_penalty"].bounds())
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, **RANGES["min_tokens"].bounds())
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    truncate_prompt_tokens: int | None = Field(default=None, **RANGES["truncate_prompt_tokens"].bounds())
    prompt_logprobs: int | None = Field(default=None, **RANGES["prompt_logprobs"].bounds())

    def to_sampling_params(
        self,
        max_tokens: int | None,
        defaults: dict[str, Any],
        logprobs: int | None,
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
            n=self.n,
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0),
            repetition_penalty=pick("repetition_penalty", 1.0),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias,
            allowed_token_ids=self.allowed_token_ids,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            structured_outputs=self.structured_params(),
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    # OpenAI's default for completions. 0 only with echo: score the prompt, generate nothing.
    max_tokens: int | None = Field(default=16, **RANGES["max_tokens"].bounds(low=0))
    logprobs: int | None = Field(default=None, **RANGES["logprobs"].bounds(low=0))
    echo: bool = False
    suffix: str | None = None
    use_beam_search: bool = False
    length_penalty: float = Field(default=1.0, allow_inf_nan=False)
    add_special_tokens: bool = True

    _reject = model_validator(mode="before")(lambda data: reject_unsupported(data, COMPLETION_RULES))

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) and no completion, as vLLM."""
        return self.echo and self.max_tokens == 0

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: PromptInput) -> PromptInput:
        # "" tokenizes to just BOS, so without this check it quietly "succeeds" with text that no
        # prompt conditioned; an empty list, or an empty prompt inside a batch, is the same mistake.
        items = [v] if isinstance(v, str) else v
        if not items or any(isinstance(p, (str, list)) and not p for p in items):
            raise ValueError("prompt must not be empty")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: Text

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, data: Any) -> Any:
        # Name the part type a client sent (image_url, input_audio, ...) rather than a schema mismatch.
        if isinstance(data, dict) and data.get("type") != "text":
            raise ValueError(f"unsupported content part type {data.get('type')!r}: only text is supported")
        return data


class ChatMessage(BaseModel):
    # Templates may read other keys of a message (name, tool_call_id, ...): pass them through.
    model_config = ConfigDict(extra="allow", strict=True)

    role: str = Field(min_length=1)
    content: Text | list[TextPart] | None = None


def check_tool_results(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A tool message answers a call an earlier assistant message made: a `tool_call_id` no call had
    is a 400 naming it (OpenAI's rule too), not a result the template files under nothing."""
    calls: set[str] = set()
    for i, message in enumerate(messages):
        extra = message.model_extra or {}
        if message.role == "assistant" and isinstance(extra.get("tool_calls"), list):
            calls.update(c["id"] for c in extra["tool_calls"] if isinstance(c, dict) and isinstance(c.get("id"), str))
        elif message.role == "tool" and extra.get("tool_call_id") is not None and extra["tool_call_id"] not in calls:
            why = f"{extra['tool_call_id']!r} answers no tool call of an earlier assistant message"
            raise PydanticCustomError(
                "unsupported_field", "'{field}': {why}", {"field": f"messages.{i}.tool_call_id", "why": why}
            )
    return messages


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], AfterValidator(check_tool_results)] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, **RANGES["max_tokens"].bounds())
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, **RANGES["logprobs"].bounds(low=0))
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # templates write their own BOS
    chat_template: Text | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    include_reasoning: bool = True  # vLLM's: false leaves the thinking out of the answer

    _reject = model_validator(mode="before")(lambda data: reject_unsupported(data, CHAT_RULES))
    _legacy = model_validator(mode="before")(map_legacy_functions)  # functions -> tools


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[TokenId]
