"""Beam search on /v1/completions (`use_beam_search: true`, vLLM's extra): `n` is the beam width
and each prompt's `n` best beams are its choices, best first. Streaming sends every choice in one
chunk when the search ends: a beam's text is only final once the whole search is."""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

from tram.server.beam_search import BeamSearchSequence, beam_search
from tram.server.errors import stream_error_event
from tram.server.protocol import CompletionRequest
from tram.server.utils import DONE_EVENT, gather_or_cancel, sse

if TYPE_CHECKING:
    from tram.server.serving_completion import OpenAIServingCompletion


class BeamSearchCompletion:
    def __init__(self, serving: OpenAIServingCompletion) -> None:
        self.serving = serving

    async def run(self, req: CompletionRequest, request_id: str,
                  prompts: list[tuple[str | None, list[int]]]) -> dict:
        s = self.serving
        # The remaining context when max_tokens is null, as a sampled completion would get.
        searches = [beam_search(s.engine, ids, req.n, req.max_tokens or s.max_model_len - len(ids),
                                length_penalty=req.length_penalty, ignore_eos=req.ignore_eos,
                                request_id=f"{request_id}-{i}")
                    for i, (_, ids) in enumerate(prompts)]
        results = await gather_or_cancel(searches)
        choices, completion_tokens = [], 0
        for i, ((text, ids), beams) in enumerate(zip(prompts, results)):
            for j, beam in enumerate(beams):
                choices.append(self._choice(req, i * req.n + j, text, ids, beam))
                completion_tokens += len(beam.tokens)
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        return {"id": request_id, "object": "text_completion", "created": s.created(), "model": s.model_name,
                "choices": choices, "usage": s.usage(prompt_tokens, completion_tokens)}

    def _choice(self, req: CompletionRequest, index: int, prompt: str | None, ids: list[int],
                beam: BeamSearchSequence) -> dict:
        text = beam.text or ""
        if req.echo:
            prompt_text = prompt if prompt is not None else self.serving.tokenizer.decode(ids)
            text = prompt_text + text
        return {"index": index, "text": text, "logprobs": None,
                "finish_reason": beam.finish_reason, "stop_reason": None}

    async def stream(self, req: CompletionRequest, request_id: str, work: Awaitable[dict]) -> AsyncIterator[str]:
        try:
            body = await work
            head = {k: body[k] for k in ("id", "object", "created", "model")}
            yield sse({**head, "choices": body["choices"]})
            if req.include_usage:
                yield sse({**head, "choices": [], "usage": body["usage"]})
        except Exception as e:  # noqa: BLE001 - the status line is gone; report in the stream
            yield stream_error_event(e)
        yield DONE_EVENT

