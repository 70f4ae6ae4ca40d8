"""POST /v1/responses: OpenAI's Responses API for text. The input becomes chat messages rendered by
the chat endpoint's template code; the answer is one assistant message, returned as a response
object or streamed as Responses events (`event:` + `data:` lines, as OpenAI and vLLM send them)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.engine.input_processor import LengthRule, PromptTooLongError
from tram.outputs import RequestOutput
from tram.sampling_params import SamplingParams
from tram.server.handlers.base import OpenAIServing
from tram.server.handlers.chat import OpenAIServingChat
from tram.server.handlers.streams import respond_unless_disconnected, sse
from tram.server.http.large_json import off_loop_if_large
from tram.server.protocol.errors import APIError, exception_to_error
from tram.server.protocol.responses import ResponsesRequest

# Prompt-length errors blame `input`, as the chat endpoint's blame `messages`.
INPUT_LENGTH_RULE = LengthRule(completion_must_fit=True, prompt_field="input")
# Chat's names for the fields this API spells otherwise: errors raised by code shared with chat
# reach a Responses client in its own words.
_CHAT_NAMES = re.compile(r"\b(response_format\.json_schema|response_format|max_tokens)\b")
_RESPONSES_NAMES = {
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
}


def in_responses_words(e: BaseException) -> APIError:
    """The error a chat-shaped failure is to a Responses client: its fields under their names here."""
    err = exception_to_error(e)

    def rename(text: str) -> str:
        return _CHAT_NAMES.sub(lambda m: _RESPONSES_NAMES[m.group(1)], text)

    return APIError(err.status, rename(err.message), err.param and rename(err.param), err.code)


def new_id(prefix: str) -> str:
    """OpenAI's ids for this API: `resp_...`, `msg_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


@dataclass
class Generation:
    """What a request has produced so far, from its one final output or its DELTA outputs."""

    pieces: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None

    def add(self, out: RequestOutput) -> str:
        """Take in one output (a DELTA, or the final one) and return its new text."""
        (c,) = out.outputs  # the Responses API has no `n`: one sample
        self.input_tokens = len(out.prompt_token_ids)
        self.cached_tokens = out.num_cached_tokens
        self.output_tokens += len(c.token_ids)
        self.finish_reason = c.finish_reason
        self.pieces.append(c.text)
        return c.text

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def status(self) -> str:
        # "length" is max_output_tokens (or the end of the context, which OpenAI reports the same
        # way); an abort the client did not cause has no reason OpenAI names.
        return "completed" if self.finish_reason == "stop" else "incomplete"

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


class ResponseBuilder:
    """The response object of one request at any point of its life; ids and times fixed at creation."""

    def __init__(self, req: ResponsesRequest, params: SamplingParams, model: str) -> None:
        self.id, self.message_id = new_id("resp"), new_id("msg")
        self.created_at = int(time.time())
        self.model = model
        # The request's settings as OpenAI echoes them (the SDK's `Response` needs several), with
        # the sampling values actually used (the model's generation config fills what was omitted).
        self.settings = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "tool_choice": req.tool_choice or "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "background": False,
            "truncation": "disabled",
            "user": req.user,
        }

    def message(self, gen: Generation | None) -> dict[str, Any]:
        """The output message item; None while nothing is generated yet (as streamed first)."""
        item: dict[str, Any] = {"type": "message", "id": self.message_id, "role": "assistant"}
        if gen is None:
            return {**item, "status": "in_progress", "content": []}
        status = "completed" if gen.status == "completed" else "incomplete"
        return {**item, "status": status, "content": [text_part(gen.text)]}

    def body(self, gen: Generation | None) -> dict[str, Any]:
        """The response object: in progress (no output, no usage) until `gen` is finished."""
        status = "in_progress" if gen is None else gen.status
        incomplete = {"reason": "max_output_tokens"} if gen is not None and gen.finish_reason == "length" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "model": self.model,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "output": [] if gen is None else [self.message(gen)],
            "usage": None if gen is None else gen.usage(),
            **self.settings,
        }


class EventWriter:
    """Numbers the events of one stream (`sequence_number` from 0) and writes them as SSE."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\n{sse(payload)}"

    def error(self, e: BaseException) -> str:
        """The Responses API's `error` event. Not the `{"error": {...}}` body of the other endpoints'
        streams: the SDK reads this API's events by `type`, and OpenAI's `code` is a string."""
        err = exception_to_error(e)
        code = err.code if isinstance(err.code, str) else str(err.status)
        return self("error", code=code, message=err.message, param=err.param)


async def stream_events(response: ResponseBuilder, stream: RequestStream) -> AsyncIterator[str]:
    """The events of one response: its lifecycle around one message with one text part, a delta
    event per DELTA output that brings text. Leaving early (a client gone) aborts the request."""
    event = EventWriter()
    where = {"item_id": response.message_id, "output_index": 0, "content_index": 0}
    gen = Generation()
    try:
        yield event("response.created", response=response.body(None))
        yield event("response.in_progress", response=response.body(None))
        yield event("response.output_item.added", output_index=0, item=response.message(None))
        yield event("response.content_part.added", **where, part=text_part(""))
        async for out in stream:
            delta = gen.add(out)
            if delta:
                yield event("response.output_text.delta", **where, delta=delta, logprobs=[])
        yield event("response.output_text.done", **where, text=gen.text, logprobs=[])
        yield event("response.content_part.done", **where, part=text_part(gen.text))
        yield event("response.output_item.done", output_index=0, item=response.message(gen))
        final = response.body(gen)
        # As OpenAI: a response cut short ends with `response.incomplete`, not `response.completed`.
        yield event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
        yield event.error(e)
    finally:
        await stream.aclose()


@dataclass
class _Conversation:
    """What `OpenAIServingChat.render` reads of a chat request."""

    messages: list[Any]
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class OpenAIServingResponses(OpenAIServing):
    def __init__(self, chat: OpenAIServingChat) -> None:
        super().__init__(chat.engine, chat.served_model_names, chat.chat_template, chat.threads)
        self.chat = chat

    async def create_response(self, req: ResponsesRequest, raw: Request) -> Response:
        self.check_model(req.model)
        problem = req.unsupported()
        if problem is not None:
            param, message = problem
            raise APIError(400, message, param)
        ids = await self._render(req)
        try:
            fields = req.sampling_fields()
            params = await off_loop_if_large(raw, fields.to_sampling_params, req.max_output_tokens, self.defaults, None)
        except ValueError as e:
            raise in_responses_words(e) from e
        if params.structured_outputs is not None:  # errors name this API's field
            params.structured_outputs = msgspec.structs.replace(params.structured_outputs, source_field="text.format")
        response = ResponseBuilder(req, params, self.model_name)
        stream = self._submit(ids, params, response.id)
        if req.stream:
            if params.structured_outputs is not None:
                await stream.started()  # a grammar the engine refuses is a 400, not an error event
            return StreamingResponse(stream_events(response, stream), media_type="text/event-stream")
        return await respond_unless_disconnected(raw, self._collect(response, stream))

    async def _render(self, req: ResponsesRequest) -> list[int]:
        """The chat endpoint's rendering of these messages; its errors blame `input` here."""
        try:
            return await self.chat.render(_Conversation(req.messages()), rule=INPUT_LENGTH_RULE)
        except APIError as e:
            raise APIError(e.status, e.message, "input" if e.param == "messages" else e.param, e.code) from e
        except PromptTooLongError as e:
            raise APIError(400, str(e), "input", e.code) from e

    def _submit(self, ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
        try:
            return self.engine.add_request({"prompt_token_ids": ids}, params, request_id, INPUT_LENGTH_RULE)
        except PromptTooLongError as e:
            raise in_responses_words(e) from e  # the input processor names chat's max_tokens

    async def _collect(self, response: ResponseBuilder, stream: RequestStream) -> dict[str, Any]:
        final: RequestOutput | None = None
        async for out in stream:
            final = out
        assert final is not None
        gen = Generation()
        gen.add(final)
        return response.body(gen)
