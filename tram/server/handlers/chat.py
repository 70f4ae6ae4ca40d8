"""POST /v1/chat/completions: messages through the chat template, n choices, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.engine.input_processor import LengthRule, PromptTooLongError
from tram.engine.logprob_text import token_text_table
from tram.engine.tokenizer import MissingChatTemplateError, apply_chat_template
from tram.outputs import CompletionOutput, RequestOutput
from tram.server.handlers.base import (
    MESSAGES_LENGTH_RULE,
    OpenAIServing,
    json_logprob,
    prompt_logprobs_json,
    random_id,
)
from tram.server.handlers.choice_ledger import ChoiceLedger
from tram.server.handlers.streams import DONE_EVENT, respond_unless_disconnected, sse
from tram.server.http.large_json import off_loop_if_large
from tram.server.protocol.errors import APIError, stream_error_event
from tram.server.protocol.openai import ChatCompletionRequest, ChatMessage, TokenizeRequest
from tram.server.reasoning.plan import ReasoningPlan, ReasoningSetup, reasoning_fields
from tram.server.tools.chat import ToolPlan, apply_tool_plan, plan_tools, template_messages, tool_calls_json
from tram.server.tools.chat_stream import ChoiceDelta, ChoiceToolStreams
from tram.server.tools.parsers import get_tool_parser


def _message_dict(m: ChatMessage) -> dict[str, Any]:
    """Flatten OpenAI content parts to text: templates of text models expect a string."""
    d = m.model_dump(exclude_none=True)
    if isinstance(m.content, list):
        d["content"] = "\n".join(part.text for part in m.content)
    return d


def _text_chars(messages: list[ChatMessage]) -> int:
    """The messages' text in characters, which picks the tokenizer thread that renders them."""
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content is not None:
            total += sum(len(part.text) for part in m.content)
    return total


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        *args: Any,
        response_role: str = "assistant",
        tool_call_parser: str | None = None,
        enable_auto_tool_choice: bool = False,
        reasoning_parser: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.response_role = response_role  # --response-role
        self.tool_parser = get_tool_parser(tool_call_parser) if tool_call_parser else None
        self.enable_auto_tool_choice = enable_auto_tool_choice
        # --reasoning-parser: refused here, as the server starts, when the model lacks its markers.
        self.reasoning = ReasoningSetup.load(reasoning_parser, self.tokenizer) if reasoning_parser else None

    def _render_now(
        self, req: ChatCompletionRequest | TokenizeRequest, tools: list[dict[str, Any]] | None, rule: LengthRule
    ) -> list[int]:
        """On a tokenizer thread: render, refuse a text that provably cannot fit, tokenize."""
        template = getattr(req, "chat_template", None) or self.chat_template
        messages = template_messages([_message_dict(m) for m in req.messages])  # its 400s name their field
        try:
            return apply_chat_template(
                self.tokenizer,
                messages,
                template,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                add_special_tokens=getattr(req, "add_special_tokens", False),
                check_text=lambda text: self.check_fits(text, rule),
                **({"tools": tools} if tools else {}),
                **(getattr(req, "chat_template_kwargs", None) or {}),
            )
        except PromptTooLongError:
            raise
        except MissingChatTemplateError as e:
            raise APIError(400, str(e), "chat_template") from e
        except Exception as e:  # noqa: BLE001 - a template that fails on these messages is a bad request
            raise APIError(400, f"The chat template could not render these messages: {e}", "messages") from e

    async def render(
        self,
        req: ChatCompletionRequest | TokenizeRequest,
        tools: list[dict[str, Any]] | None = None,
        rule: LengthRule = MESSAGES_LENGTH_RULE,
    ) -> list[int]:
        """The messages' prompt token ids; length errors name `rule`'s field (Responses: `input`)."""
        if self.tokenizer is None:
            raise APIError(400, "This server has no tokenizer; chat needs one")
        if req.continue_final_message and req.add_generation_prompt:
            raise APIError(
                400,
                "continue_final_message and add_generation_prompt cannot both be true: "
                "set add_generation_prompt to false",
                "continue_final_message",
            )
        chars = _text_chars(req.messages)
        self.engine.input_processor.check_text_length(chars, rule)  # the rendered text is longer still
        return await self.threads.run(chars, self._render_now, req, tools, rule)

    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs are not available when stream is true", "prompt_logprobs")
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        plan = plan_tools(req.tools, req.tool_choice, self.tool_parser, self.enable_auto_tool_choice)
        ids = await self.render(req, plan.tools)
        max_tokens = req.max_completion_tokens or req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = await off_loop_if_large(
            raw, req.to_sampling_params, max_tokens, self.defaults, logprobs, req.prompt_logprobs
        )
        apply_tool_plan(plan, req.parallel_tool_calls, params)
        reasoning = self.reasoning_plan(ids, req.chat_template_kwargs, req.include_reasoning)
        reasoning.apply(params)
        request_id = random_id("chatcmpl")
        stream = self.engine.add_request({"prompt_token_ids": ids}, params, request_id, MESSAGES_LENGTH_RULE)
        if req.stream:
            if params.structured_outputs is not None:
                await stream.started()  # a grammar the engine refuses is a 400, not an error event
            return StreamingResponse(
                self._stream(req, request_id, stream, ChoiceToolStreams(plan, reasoning)),
                media_type="text/event-stream",
            )
        return await respond_unless_disconnected(raw, self._collect(req, request_id, stream, plan, reasoning))

    def reasoning_plan(
        self, ids: list[int], template_kwargs: dict[str, Any] | None = None, include: bool = True
    ) -> ReasoningPlan:
        """What the request of prompt `ids` does about thinking (nothing without --reasoning-parser)."""
        if self.reasoning is None:
            return ReasoningPlan()
        return self.reasoning.plan(self.tokenizer, ids, template_kwargs, include)

    async def _collect(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        stream: RequestStream,
        plan: ToolPlan,
        reasoning: ReasoningPlan,
    ) -> dict:
        final: RequestOutput | None = None
        async for out in stream:
            final = out
        assert final is not None
        choices = []
        for c in final.outputs:
            thought, answer = reasoning.split(c.text)
            content, calls, finish_reason = (
                plan.finish(answer, c.finish_reason) if answer is not None else (None, [], c.finish_reason)
            )
            message: dict[str, Any] = {"role": self.response_role, "content": content}
            if reasoning.setup is not None:
                message.update(reasoning_fields(thought))
            if calls:
                message["tool_calls"] = tool_calls_json(calls)
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(req, c),
                    "finish_reason": finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
        num_gen = sum(len(c.token_ids) for c in final.outputs)
        body = {
            "id": request_id,
            "object": "chat.completion",
            "created": self.created(),
            "model": self.model_name,
            "choices": choices,
            "usage": self.usage(len(final.prompt_token_ids), num_gen),
        }
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs)
        return body

    def _logprobs(self, req: ChatCompletionRequest, c: CompletionOutput) -> dict | None:
        if not req.logprobs or c.logprobs is None:
            return None
        content = []
        for token_id, row in zip(c.token_ids, c.logprobs):
            top = sorted(
                (kv for kv in row.items() if kv[1].rank is not None and kv[1].rank <= (req.top_logprobs or 0)),
                key=lambda kv: kv[1].rank,
            )
            content.append({**self._entry(token_id, row), "top_logprobs": [self._entry(t, row) for t, _ in top]})
        return {"content": content}

    def _entry(self, token_id: int, row: dict) -> dict:
        """`token` is the text the token added (`tram.engine.logprob_text`), so the tokens add up to
        the content as completions' do: "" for a byte of an unfinished character, the whole
        character for the token completing it. `bytes` are the token's own, so they add up to
        the content's UTF-8 ([226] for <0xE2>), where OpenAI would write "bytes:\\xe2" instead."""
        lp = row[token_id]
        table = token_text_table(self.tokenizer)
        token = lp.decoded_token if lp.decoded_token is not None else table.alternative(token_id)
        return {"token": token, "logprob": json_logprob(lp.logprob), "bytes": table.token_bytes(token_id, token)}

    async def _stream(
        self, req: ChatCompletionRequest, request_id: str, stream: RequestStream, tools: ChoiceToolStreams
    ) -> AsyncIterator[str]:
        """One chunk per choice per DELTA output that has something new for it."""
        head = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": self.created(),
            "model": self.model_name,
        }
        ledger = ChoiceLedger()
        try:
            async for out in stream:
                ledger.count(out)
                for c in out.outputs:
                    if ledger.chunk_due(c.index, c):
                        delta = tools.delta(c)
                        if delta is not None:
                            yield sse({**head, "choices": [self._chunk(req, c, ledger, delta)]})
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": self.usage(ledger.prompt_tokens, ledger.completion_tokens)})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            yield stream_error_event(e)
        finally:
            await stream.aclose()
        yield DONE_EVENT

    def _chunk(self, req: ChatCompletionRequest, c: CompletionOutput, ledger: ChoiceLedger, delta: ChoiceDelta) -> dict:
        body: dict[str, Any] = delta.body
        if ledger.is_first(c.index):
            body = {"role": self.response_role, **body}
        ledger.sent(c.index, c.text)
        return {
            "index": c.index,
            "delta": body,
            "logprobs": self._logprobs(req, c),
            "finish_reason": delta.finish_reason,
            "stop_reason": c.stop_reason,
        }
