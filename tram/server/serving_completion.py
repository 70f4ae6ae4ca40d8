"""POST /v1/completions: one or several prompts (text or token ids), n choices each, streamed or not."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.outputs import CompletionOutput, RequestOutput
from tram.server.errors import APIError, stream_error_event
from tram.server.protocol import CompletionRequest
from tram.server.serving_base import OpenAIServing, random_id
from tram.server.utils import DONE_EVENT, merge_async_iterators, run_until_disconnected, sse


def _normalize_prompts(prompt: Any) -> list[str | list[int]]:
    # CompletionRequest's validator has already rejected empty prompts.
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        if req.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        request_id = random_id("cmpl")
        streams = self._submit(req, request_id)
        if req.stream:
            return StreamingResponse(self._stream(req, request_id, streams), media_type="text/event-stream")
        body = await run_until_disconnected(raw, self._collect(req, request_id, streams))
        return JSONResponse(body) if body is not None else Response(status_code=499)

    def _submit(self, req: CompletionRequest, request_id: str) -> list[RequestStream]:
        """Validate every prompt and submit them all, or none (earlier ones are aborted)."""
        prompt_lp = req.logprobs if req.echo and req.logprobs is not None else None
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(_normalize_prompts(req.prompt)):
                text = prompt if isinstance(prompt, str) else None
                ids = self.tokenize(prompt) if isinstance(prompt, str) else prompt
                self.check_length(len(ids), req.max_tokens)
                params = req.to_sampling_params(req.max_tokens, self.defaults, req.logprobs, prompt_lp)
                streams.append(self.engine.add_request(
                    {"prompt_token_ids": ids, "prompt": text}, params, f"{request_id}-{i}"
                ))
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams

    async def _collect(self, req: CompletionRequest, request_id: str, streams: list[RequestStream]) -> dict:
        finals: list[RequestOutput | None] = [None] * len(streams)
        async for i, out in merge_async_iterators(*streams):
            finals[i] = out
        choices, num_prompt, num_gen = [], 0, 0
        for i, final in enumerate(finals):
            assert final is not None
            num_prompt += len(final.prompt_token_ids)
            for c in final.outputs:
                num_gen += len(c.token_ids)
                choices.append(self._choice(req, i * req.n + c.index, final, c, 0, 0, True))
        return {"id": request_id, "object": "text_completion", "created": self.created(),
                "model": self.model_name, "choices": choices, "usage": self.usage(num_prompt, num_gen)}

    def _choice(
        self, req: CompletionRequest, index: int, out: RequestOutput, c: CompletionOutput,
        text_start: int, token_start: int, finished: bool,
    ) -> dict:
        """A choice holding the text and tokens after the given offsets (0, 0 for the whole)."""
        text = c.text[text_start:]
        echo = req.echo and text_start == 0 and token_start == 0
        prompt_text = self._prompt_text(out) if echo else ""
        logprobs = None
        if req.logprobs is not None:
            # text_offset is an offset into the whole text the client has assembled (as vLLM's
            # `initial_text_offset`): a later streamed chunk starts after the text already sent,
            # which, with echo, began with the prompt.
            offset = 0 if echo else text_start
            if req.echo and not echo:
                offset += len(self._prompt_text(out))
            logprobs = self._logprobs(out, c, token_start, echo, offset)
        return {"index": index, "text": prompt_text + text, "logprobs": logprobs,
                "finish_reason": c.finish_reason if finished else None,
                "stop_reason": c.stop_reason if finished else None}

    def _prompt_text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        return self.tokenizer.decode(out.prompt_token_ids) if self.tokenizer is not None else ""

    def _logprobs(self, out: RequestOutput, c: CompletionOutput, token_start: int, echo: bool, offset: int) -> dict:
        positions: list[tuple[int, dict | None]] = []
        if echo and out.prompt_logprobs is not None:
            positions += list(zip(out.prompt_token_ids, out.prompt_logprobs))
        positions += list(zip(c.token_ids[token_start:], (c.logprobs or [])[token_start:]))
        result: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for token_id, row in positions:
            token = self._token_text(token_id, row)
            result["text_offset"].append(offset)
            offset += len(token)
            result["tokens"].append(token)
            if row is None:  # the first prompt token has no logprob
                result["token_logprobs"].append(None)
                result["top_logprobs"].append(None)
                continue
            result["token_logprobs"].append(max(row[token_id].logprob, -9999.0))
            # The top-k by rank, plus the chosen token when it ranks below them (as vLLM).
            top = sorted(row.items(), key=lambda kv: kv[1].rank or 0)
            result["top_logprobs"].append({self._token_text(t, row): max(lp.logprob, -9999.0) for t, lp in top})
        return result

    def _token_text(self, token_id: int, row: dict | None) -> str:
        if row is not None and token_id in row and row[token_id].decoded_token is not None:
            return row[token_id].decoded_token
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"<{token_id}>"

    async def _stream(self, req: CompletionRequest, request_id: str, streams: list[RequestStream]) -> AsyncIterator[str]:
        sent: dict[int, tuple[int, int]] = {}  # choice index -> (chars, tokens) already streamed
        num_prompt, num_gen = 0, 0
        head = {"id": request_id, "object": "text_completion", "created": self.created(), "model": self.model_name}
        try:
            async for i, out in merge_async_iterators(*streams):
                for c in out.outputs:
                    index = i * req.n + c.index
                    text_at, token_at = sent.get(index, (0, 0))
                    finished = c.finish_reason is not None
                    if index in sent and (text_at, token_at) == (len(c.text), len(c.token_ids)) and not finished:
                        continue  # nothing new for this choice (e.g. text held back for a stop string)
                    if text_at == -1:
                        continue  # its final chunk already went out
                    choice = self._choice(req, index, out, c, text_at, token_at, finished)
                    sent[index] = (-1, -1) if finished else (len(c.text), len(c.token_ids))
                    yield sse({**head, "choices": [choice]})
                if out.finished:
                    num_prompt += len(out.prompt_token_ids)
                    num_gen += sum(len(c.token_ids) for c in out.outputs)
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": self.usage(num_prompt, num_gen)})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            yield stream_error_event(e)
        yield DONE_EVENT
