"""POST /v1/responses: OpenAI's Responses API. The input becomes chat messages rendered by the chat
endpoint's template code, and tools are planned as chat plans them (tools/chat.py); the answer is an
assistant message and/or function calls (responses_items.py), returned as a response object or
streamed as Responses events (`event:` + `data:` lines, as OpenAI and vLLM send them)."""

from __future__ import annotations

import re
import time
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
from tram.server.handlers.responses_items import ItemStream, new_id, output_items
from tram.server.handlers.streams import respond_unless_disconnected, sse
from tram.server.http.large_json import off_loop_if_large
from tram.server.protocol.errors import APIError, exception_to_error
from tram.server.protocol.responses import ResponsesRequest
from tram.server.reasoning.plan import ReasoningPlan
from tram.server.reasoning.responses import ReasoningItems, whole_items
from tram.server.tools.chat import ToolPlan, apply_tool_plan, plan_tools

# Prompt-length errors blame `input`, as the chat endpoint's blame `messages`.
INPUT_LENGTH_RULE = LengthRule(completion_must_fit=True, prompt_field="input")
# Chat's names for the fields this API spells otherwise: errors raised by code shared with chat
# reach a Responses client in its own words.
_CHAT_NAMES = re.compile(r"\b(response_format\.json_schema|response_format|max_tokens|(tools\.\d+\.)function\.)")
_RESPONSES_NAMES = {
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
}
# A request that offers no tools: plain text, as before tools existed here.
NO_TOOLS = ToolPlan(None, "none", "none")


def in_responses_words(e: BaseException) -> APIError:
    """The error a chat-shaped failure is to a Responses client: its fields under their names here."""
    err = exception_to_error(e)

    def rename(text: str) -> str:
        # Chat nests a tool's fields under `function`; this API's tools are flat.
        return _CHAT_NAMES.sub(lambda m: m.group(2) or _RESPONSES_NAMES[m.group(1)], text)

    return APIError(err.status, rename(err.message), err.param and rename(err.param), err.code)


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
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "text": {"format": {"type": "text"}},
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "background": False,
            "truncation": "disabled",
            "user": req.user,
        }

    def body(self, gen: Generation | None, output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
            "output": output or [],
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


async def stream_events(
    response: ResponseBuilder, stream: RequestStream, plan: ToolPlan = NO_TOOLS, reasoning: ReasoningPlan | None = None
) -> AsyncIterator[str]:
    """The events of one response: its lifecycle around its items (responses_items.py), delta
    events as DELTA outputs bring text. Leaving early (a client gone) aborts the request."""
    event = EventWriter()
    items: ItemStream | ReasoningItems = ItemStream(event, plan.new_stream(), response.message_id)
    if reasoning is not None and reasoning.setup is not None:  # the thinking first, as a reasoning item
        items = ReasoningItems(event, reasoning, items, new_id("rs"))
    gen = Generation()
    try:
        yield event("response.created", response=response.body(None))
        yield event("response.in_progress", response=response.body(None))
        for chunk in items.begin():
            yield chunk
        async for out in stream:
            for chunk in items.feed(gen.add(out)):
                yield chunk
        for chunk in items.end(gen.status):
            yield chunk
        final = response.body(gen, items.items)
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
        plan = self._plan_tools(req)
        ids = await self._render(req, plan.tools)
        params = await self._sampling_params(req, raw, plan)
        reasoning = self.chat.reasoning_plan(ids)
        reasoning.apply(params)
        response = ResponseBuilder(req, params, self.model_name)
        stream = self._submit(ids, params, response.id)
        if req.stream:
            if params.structured_outputs is not None:
                await stream.started()  # a grammar the engine refuses is a 400, not an error event
            return StreamingResponse(stream_events(response, stream, plan, reasoning), media_type="text/event-stream")
        return await respond_unless_disconnected(raw, self._collect(response, stream, plan, reasoning))

    async def _sampling_params(self, req: ResponsesRequest, raw: Request, plan: ToolPlan) -> SamplingParams:
        try:
            fields = req.sampling_fields()
            params = await off_loop_if_large(raw, fields.to_sampling_params, req.max_output_tokens, self.defaults, None)
            if params.structured_outputs is not None:  # errors name this API's field
                params.structured_outputs = msgspec.structs.replace(
                    params.structured_outputs, source_field="text.format"
                )
            apply_tool_plan(plan, req.parallel_tool_calls, params)
        except ValueError as e:
            raise in_responses_words(e) from e
        return params

    def _plan_tools(self, req: ResponsesRequest) -> ToolPlan:
        """Chat's rules for tools (auto needs the server's parser); errors in this API's words."""
        try:
            return plan_tools(
                req.chat_tools(), req.chat_tool_choice(), self.chat.tool_parser, self.chat.enable_auto_tool_choice
            )
        except APIError as e:
            raise in_responses_words(e) from e

    async def _render(self, req: ResponsesRequest, tools: list[dict[str, Any]] | None) -> list[int]:
        """The chat endpoint's rendering of these messages; its errors blame `input` here (the
        messages are not the items one for one: `messages.3...` names no item of `input`)."""
        try:
            return await self.chat.render(_Conversation(req.messages()), tools, rule=INPUT_LENGTH_RULE)
        except APIError as e:
            param = "input" if e.param is not None and e.param.startswith("messages") else e.param
            raise APIError(e.status, e.message, param, e.code) from e
        except PromptTooLongError as e:
            raise APIError(400, str(e), "input", e.code) from e

    def _submit(self, ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
        try:
            return self.engine.add_request({"prompt_token_ids": ids}, params, request_id, INPUT_LENGTH_RULE)
        except PromptTooLongError as e:
            raise in_responses_words(e) from e  # the input processor names chat's max_tokens

    async def _collect(
        self, response: ResponseBuilder, stream: RequestStream, plan: ToolPlan, reasoning: ReasoningPlan
    ) -> dict[str, Any]:
        final: RequestOutput | None = None
        async for out in stream:
            final = out
        assert final is not None
        gen = Generation()
        gen.add(final)
        thoughts, answer = whole_items(reasoning, gen.text, gen.status, new_id("rs"))
        content, calls, _ = plan.finish(answer, gen.finish_reason)
        # A response that only thought has no empty message after its reasoning item (as streamed).
        answers = output_items(content, calls, gen.status, response.message_id) if answer or not thoughts else []
        return response.body(gen, thoughts + answers)
