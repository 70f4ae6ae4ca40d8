"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, as vLLM serves it.

A request becomes the chat request that says the same (protocol/anthropic.py `to_chat`), and from
there everything is chat's: its template renders the conversation, its sampling fields make the
parameters, its tool plan (the server's --tool-call-parser for "auto", a grammar for "any" or a
named tool) turns the model's text into calls. The answer is said back as Anthropic's message, or
its stream of events (anthropic_stream.py); failures in Anthropic's error shape (anthropic_errors.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.outputs import RequestOutput
from tram.sampling_params import SamplingParamError
from tram.server.handlers.anthropic_message import MessageBuilder
from tram.server.handlers.anthropic_stream import stream_message
from tram.server.handlers.base import MESSAGES_LENGTH_RULE, OpenAIServing
from tram.server.handlers.chat import OpenAIServingChat
from tram.server.handlers.streams import respond_unless_disconnected
from tram.server.http.large_json import off_loop_if_large
from tram.server.protocol.anthropic import CountTokensRequest, MessagesRequest
from tram.server.protocol.errors import APIError
from tram.server.protocol.openai import ChatCompletionRequest
from tram.server.reasoning.plan import ReasoningPlan
from tram.server.tools.chat import apply_tool_plan, plan_tools


class AnthropicServingMessages(OpenAIServing):
    def __init__(self, chat: OpenAIServingChat) -> None:
        super().__init__(chat.engine, chat.served_model_names, chat.chat_template, chat.threads)
        self.chat = chat

    async def create_message(self, req: MessagesRequest, raw: Request) -> Response:
        chat_req = self._chat_request(req)
        plan = plan_tools(
            chat_req.tools, chat_req.tool_choice, self.chat.tool_parser, self.chat.enable_auto_tool_choice
        )
        ids = await self.chat.render(chat_req, plan.tools)
        params = await off_loop_if_large(raw, chat_req.to_sampling_params, req.max_tokens, self.defaults, None)
        try:
            apply_tool_plan(plan, chat_req.parallel_tool_calls, params)
        except SamplingParamError as e:
            forced = req.tool_choice.type if req.tool_choice is not None else "any"
            why = f"tool_choice type {forced!r} cannot be combined with output_config.format: both constrain the output"
            raise APIError(400, why, "tool_choice") from e
        reasoning = self._reasoning_plan(chat_req, ids)
        reasoning.apply(params)  # a constraint waits for the thinking to end
        message = MessageBuilder(req.model, len(ids), plan, reasoning, req.stop_sequences or [])
        stream = self.engine.add_request({"prompt_token_ids": ids}, params, message.id, MESSAGES_LENGTH_RULE)
        if req.stream:
            if params.structured_outputs is not None:
                await stream.started()  # a grammar the engine refuses is a 400, not an error event
            return StreamingResponse(stream_message(message, stream), media_type="text/event-stream")
        return await respond_unless_disconnected(raw, _collect(message, stream))

    def _chat_request(self, req: CountTokensRequest) -> ChatCompletionRequest:
        """The chat request that says the same; thinking asked of a server that cannot split it
        from the answer is refused rather than returned as text."""
        self.check_model(req.model)
        if self.chat.reasoning is None and req.thinking is not None and req.thinking.type != "disabled":
            raise APIError(400, "this server has no --reasoning-parser: send thinking.type 'disabled'", "thinking")
        return ChatCompletionRequest.model_validate(req.to_chat())

    def _reasoning_plan(self, chat_req: ChatCompletionRequest, ids: list[int]) -> ReasoningPlan:
        setup = self.chat.reasoning
        return (
            ReasoningPlan() if setup is None else setup.plan(self.tokenizer, ids, chat_req.chat_template_kwargs, True)
        )

    async def count_tokens(self, req: CountTokensRequest) -> dict[str, Any]:
        """The prompt the conversation renders to, counted as /v1/messages would send it."""
        chat_req = self._chat_request(req)
        tools = [t.model_dump(exclude_none=True) for t in chat_req.tools] if chat_req.tools else None
        return {"input_tokens": len(await self.chat.render(chat_req, tools))}


async def _collect(message: MessageBuilder, stream: RequestStream) -> dict[str, Any]:
    final: RequestOutput | None = None
    async for out in stream:
        final = out
    assert final is not None
    return message.whole(message.add(final).text)
