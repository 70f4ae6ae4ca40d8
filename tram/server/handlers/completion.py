"""POST /v1/completions: one or several prompts (text or token ids), n choices each, streamed or not."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.engine.logprob_text import leading_token_text, token_text_table
from tram.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from tram.sampling_params import SamplingParams
from tram.server.handlers.base import (
    PROMPT_LENGTH_RULE,
    OpenAIServing,
    json_logprob,
    prompt_logprobs_json,
    random_id,
)
from tram.server.handlers.beam_search import BeamSearchCompletion
from tram.server.handlers.choice_ledger import ChoiceLedger
from tram.server.handlers.streams import DONE_EVENT, merge_async_iterators, respond_unless_disconnected, sse
from tram.server.http.large_json import off_loop_if_large
from tram.server.protocol.errors import APIError, stream_error_event
from tram.server.protocol.openai import CompletionRequest


def _normalize_prompts(prompt: Any) -> list[str | list[int]]:
    # CompletionRequest's validator has already rejected empty prompts.
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return list(prompt)


def _visible(req: CompletionRequest, out: RequestOutput) -> RequestOutput:
    """What the client sees of an output: an echo-only request (max_tokens 0) ran one token that
    nobody asked for; it is dropped, and the choice ends with "length" (its zero tokens)."""
    if not req.echo_only:
        return out
    return replace(
        out,
        outputs=[
            replace(
                c,
                text="",
                token_ids=[],
                logprobs=[] if c.logprobs is not None else None,
                cumulative_logprob=0.0,
                stop_reason=None,
                finish_reason="length" if c.finish_reason else None,
            )
            for c in out.outputs
        ],
    )


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        self._check(req)
        request_id = random_id("cmpl")
        if req.use_beam_search:
            work = self.beams.run(req, request_id, await self._prompts(req))
            if req.stream:
                return StreamingResponse(self.beams.stream(req, request_id, work), media_type="text/event-stream")
            return await respond_unless_disconnected(raw, work)
        params = await off_loop_if_large(raw, self.sampling_params, req)
        streams = await self._submit(req, request_id, params)
        if req.stream:
            if params.structured_outputs is not None:
                await self._started(streams)  # a grammar the engine refuses is a 400, not an error event
            return StreamingResponse(self._stream(req, request_id, streams), media_type="text/event-stream")
        return await respond_unless_disconnected(raw, self._collect(req, request_id, streams))

    @functools.cached_property
    def beams(self) -> BeamSearchCompletion:
        return BeamSearchCompletion(self)

    @staticmethod
    def _check(req: CompletionRequest) -> None:
        if req.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        if req.max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens 0 is only allowed with echo (to score the prompt)", "max_tokens")
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs are not available when stream is true", "prompt_logprobs")
        if req.use_beam_search and req.structured_params() is not None:
            raise APIError(400, "use_beam_search cannot be combined with structured outputs", "use_beam_search")
        if req.use_beam_search and (req.logprobs is not None or req.prompt_logprobs is not None or req.echo_only):
            raise APIError(
                400,
                "use_beam_search returns no logprobs: drop logprobs, prompt_logprobs or max_tokens 0",
                "use_beam_search",
            )

    async def _prompts(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text, token ids) of every prompt, tokenized off the event loop."""
        check_length = req.truncate_prompt_tokens is None  # truncation may make a long text fit
        prompts = []
        for prompt in _normalize_prompts(req.prompt):
            if isinstance(prompt, str):
                prompts.append((prompt, await self.tokenize(prompt, req.add_special_tokens, check_length)))
            else:
                prompts.append((None, prompt))
        return prompts

    def sampling_params(self, req: CompletionRequest) -> SamplingParams:
        # An echo-only request generates one token (the engine samples at least one) and drops it.
        max_tokens = 1 if req.echo_only else req.max_tokens
        prompt_lp = req.prompt_logprobs
        if prompt_lp is None and req.echo and req.logprobs is not None:
            prompt_lp = req.logprobs  # the echoed prompt's own logprobs
        return req.to_sampling_params(max_tokens, self.defaults, req.logprobs, prompt_lp)

    async def _submit(self, req: CompletionRequest, request_id: str, params: SamplingParams) -> list[RequestStream]:
        """Validate every prompt and submit them all, or none (earlier ones are aborted). One
        SamplingParams for every prompt: the engine never mutates a request's params (n > 1
        samples get their own copies in register_request), so no per-prompt copy is needed."""
        streams: list[RequestStream] = []
        try:
            for i, (text, ids) in enumerate(await self._prompts(req)):
                streams.append(
                    self.engine.add_request(
                        {"prompt_token_ids": ids, "prompt": text}, params, f"{request_id}-{i}", PROMPT_LENGTH_RULE
                    )
                )
                # Thousands of prompts in one request must not hold the loop (and /health) meanwhile.
                await asyncio.sleep(0)
        except BaseException:
            for s in streams:
                s.close()
            raise
        return streams

    @staticmethod
    async def _started(streams: list[RequestStream]) -> None:
        try:
            for stream in streams:
                await stream.started()
        except BaseException:
            for stream in streams:
                stream.close()
            raise

    async def _collect(self, req: CompletionRequest, request_id: str, streams: list[RequestStream]) -> dict:
        # FINAL_ONLY streams each yield once, so waiting on them in turn takes no longer than merging
        # them, without a task per prompt (10,000 prompts made 10,000 tasks for the collector to walk).
        finals: list[RequestOutput | None] = [None] * len(streams)
        try:
            for i, stream in enumerate(streams):
                async for out in stream:
                    finals[i] = out
        finally:
            for stream in streams:
                stream.close()
        ledger = ChoiceLedger()
        choices = []
        for i, final in enumerate(finals):
            assert final is not None
            final = _visible(req, final)
            ledger.count(final)
            for c in final.outputs:
                choices.append(self._choice(req, i * req.n + c.index, final, c, ledger, final.prompt_logprobs))
        return {
            "id": request_id,
            "object": "text_completion",
            "created": self.created(),
            "model": self.model_name,
            "choices": choices,
            "usage": self.usage(ledger.prompt_tokens, ledger.completion_tokens),
        }

    def _choice(
        self,
        req: CompletionRequest,
        index: int,
        out: RequestOutput,
        c: CompletionOutput,
        ledger: ChoiceLedger,
        prompt_logprobs: PromptLogprobs | None,
    ) -> dict:
        """The chunk of a choice for one (delta or final) output; its first chunk echoes the prompt."""
        echo = req.echo and ledger.is_first(index)
        prompt_text = self._prompt_text(out) if echo else ""
        text = prompt_text + c.text
        ledger.sent(index, text)
        logprobs = None
        if req.logprobs is not None:
            logprobs = self._logprobs(index, out, c, ledger, prompt_text, prompt_logprobs if echo else None)
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs)
        return choice

    def _prompt_text(self, out: RequestOutput) -> str:
        if out.prompt is not None:
            return out.prompt
        # A prompt sent as token ids (or truncated) echoes as text without BOS and other special tokens,
        # which the text a client sends never shows either.
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=True)

    def _logprobs(
        self,
        index: int,
        out: RequestOutput,
        c: CompletionOutput,
        ledger: ChoiceLedger,
        prompt_text: str,
        prompt_logprobs: PromptLogprobs | None,
    ) -> dict:
        """A chunk's logprobs: its echoed prompt's positions (from offset 0), then its tokens'.

        Each token is the text it added (`tram.engine.logprob_text`), so `text_offset` indexes the
        choice's whole text. Offsets follow the tokens, not the chunk's text: text held back from
        a chunk (a possible stop string) has had its tokens counted already.
        """
        result: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        if prompt_logprobs is not None:
            ids = out.prompt_token_ids
            tokens = [self._token_text(t, row) for t, row in zip(ids[1:], prompt_logprobs[1:])]
            first = leading_token_text(prompt_text, tokens, self._token_text(ids[0], None))
            self._add_positions(result, zip(ids, prompt_logprobs), [first, *tokens], 0)
        rows = c.logprobs or []
        tokens = [self._token_text(t, row) for t, row in zip(c.token_ids, rows)]
        # The first chunk's tokens start after the echoed prompt, whatever its tokens add up to.
        offset = ledger.token_offset(index, sum(len(t) for t in tokens), start=len(prompt_text))
        self._add_positions(result, zip(c.token_ids, rows), tokens, offset)
        return result

    def _add_positions(
        self,
        result: dict[str, list],
        positions: Iterable[tuple[int, dict | None]],
        tokens: list[str],
        offset: int,
    ) -> None:
        for (token_id, row), token in zip(positions, tokens):
            result["text_offset"].append(offset)
            offset += len(token)
            result["tokens"].append(token)
            if row is None:  # the first prompt token has no logprob
                result["token_logprobs"].append(None)
                result["top_logprobs"].append(None)
                continue
            result["token_logprobs"].append(json_logprob(row[token_id].logprob))
            # The top-k by rank, plus the chosen token when it ranks below them (as vLLM).
            top = sorted(row.items(), key=lambda kv: kv[1].rank or 0)
            result["top_logprobs"].append({self._token_text(t, row): json_logprob(lp.logprob) for t, lp in top})

    def _token_text(self, token_id: int, row: dict | None) -> str:
        if row is not None and token_id in row and row[token_id].decoded_token is not None:
            return row[token_id].decoded_token
        if self.tokenizer is None:
            return f"<{token_id}>"
        return token_text_table(self.tokenizer).alternative(token_id)

    async def _stream(
        self, req: CompletionRequest, request_id: str, streams: list[RequestStream]
    ) -> AsyncIterator[str]:
        """One chunk per choice per DELTA output that has something new for it."""
        head = {"id": request_id, "object": "text_completion", "created": self.created(), "model": self.model_name}
        ledger = ChoiceLedger()
        # A request's prompt logprobs come once, complete, with its first output; each of its n
        # choices echoes them in its own first chunk.
        prompt_logprobs: dict[int, PromptLogprobs] = {}
        try:
            async for i, out in merge_async_iterators(*streams):
                out = _visible(req, out)
                ledger.count(out)
                if out.prompt_logprobs is not None:
                    prompt_logprobs[i] = out.prompt_logprobs
                for c in out.outputs:
                    index = i * req.n + c.index
                    if ledger.chunk_due(index, c):
                        choice = self._choice(req, index, out, c, ledger, prompt_logprobs.get(i))
                        yield sse({**head, "choices": [choice]})
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": self.usage(ledger.prompt_tokens, ledger.completion_tokens)})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            yield stream_error_event(e)
        yield DONE_EVENT
