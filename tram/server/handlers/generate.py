"""vLLM's legacy POST /generate: {"prompt", "stream", SamplingParams fields...} -> {"text": [prompt + output]}.

`use_beam_search: true` runs beam search with `n` as the beam width; streaming sends newline-delimited
cumulative JSON objects.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tram.engine.async_llm import RequestStream
from tram.outputs import RequestOutput
from tram.sampling_params import RequestOutputKind, SamplingParams
from tram.server.handlers.base import PROMPT_LENGTH_RULE, OpenAIServing, random_id
from tram.server.handlers.beam_search import beam_search
from tram.server.handlers.streams import respond_unless_disconnected
from tram.server.protocol.errors import APIError, error_body, exception_to_error
from tram.server.protocol.generate import GenerateRequest


def _line(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False) + "\n"


class LegacyGenerate(OpenAIServing):
    async def generate(self, body: GenerateRequest, raw: Request) -> Response:
        self.check_model(body.model)
        prompt, stream = body.prompt, body.stream
        use_beam_search, length_penalty = body.use_beam_search, body.length_penalty
        params = SamplingParams(**body.sampling_kwargs())
        ids = await self.tokenize(prompt, check_length=params.truncate_prompt_tokens is None)
        request_id = random_id("generate")
        if use_beam_search and params.structured_outputs is not None:
            raise APIError(400, "use_beam_search cannot be combined with structured_outputs", "use_beam_search")
        if use_beam_search:
            self.engine.input_processor.check_prompt_length(len(ids), params.max_tokens, PROMPT_LENGTH_RULE)
            work = self._beam(prompt, ids, params, length_penalty, request_id)
            if stream:
                return StreamingResponse(self._beam_stream(work), media_type="application/x-ndjson")
        else:
            # The protocol streams cumulative texts, one JSON line per step.
            params.output_kind = RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY
            handle = self.engine.add_request(
                {"prompt_token_ids": ids, "prompt": prompt}, params, request_id, PROMPT_LENGTH_RULE
            )
            if stream:
                if params.structured_outputs is not None:
                    await handle.started()  # a grammar the engine refuses is a 400, not a broken stream
                return StreamingResponse(self._stream(prompt, handle), media_type="application/x-ndjson")
            work = self._collect(prompt, handle)
        return await respond_unless_disconnected(raw, work)

    async def _beam(
        self, prompt: str, ids: list[int], params: SamplingParams, length_penalty: float, request_id: str
    ) -> dict:
        beams = await beam_search(
            self.engine,
            ids,
            params.n,
            params.max_tokens or self.max_model_len - len(ids),
            length_penalty=length_penalty,
            ignore_eos=params.ignore_eos,
            request_id=request_id,
        )
        return {"text": [prompt + (b.text or "") for b in beams]}

    async def _beam_stream(self, work: Any) -> AsyncIterator[str]:
        try:
            yield _line(await work)
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            err = exception_to_error(e)
            yield _line(error_body(err.status, err.message))

    @staticmethod
    def _texts(prompt: str, out: RequestOutput) -> dict:
        return {"text": [prompt + c.text for c in out.outputs]}

    async def _collect(self, prompt: str, handle: RequestStream) -> dict:
        final = None
        async for out in handle:
            final = out
        assert final is not None
        return self._texts(prompt, final)

    async def _stream(self, prompt: str, handle: RequestStream) -> AsyncIterator[str]:
        try:
            async for out in handle:
                yield _line(self._texts(prompt, out))
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            err = exception_to_error(e)
            yield _line(error_body(err.status, err.message))
        finally:
            await handle.aclose()
