"""Beam search on top of the engine, in the manner of vLLM's `EngineClient.beam_search`.

The engine itself only samples one sequence per request, so beam search runs outside it: each step
submits one single-token request per live beam (prompt = the original prompt + that beam's tokens)
asking for the top `2 * beam_width` logprobs, and the candidates of all beams are merged here. Prefix
caching makes this cheap: every step-request shares its whole history with a request of the previous
step, so the engine recomputes only the tokens after the last full cached KV block of each beam.

On /v1/completions (`use_beam_search: true`, vLLM's extra) `n` is the beam width and each prompt's
`n` best beams are its choices, best first (`BeamSearchCompletion`). Streaming sends every choice in
one chunk when the search ends: a beam's text is only final once the whole search is.

Conventions (where vLLM leaves a choice):
- `BeamSearchSequence.tokens` holds only the generated tokens; a sequence that ended on EOS keeps the
  EOS token (its logprob is part of `cum_logprob`), as vLLM and transformers both return it. Its
  `text` leaves the EOS out, as `generate` does.
- The score is `cum_logprob / len(tokens) ** length_penalty` with the *generated* length, EOS
  included. This is transformers' convention (5.x); vLLM divides by the full length, prompt included,
  minus a trailing EOS. With a generated length, the prompt's size cannot change which beam wins.
- Only the tokenizer's EOS (`engine.eos_token_ids[0]`) ends a beam, as in vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.input_processor import LengthRule
from tram.outputs import Logprob
from tram.sampling_params import RequestOutputKind, SamplingParams
from tram.server.handlers.streams import DONE_EVENT, gather_or_cancel, sse
from tram.server.protocol.errors import stream_error_event
from tram.server.protocol.openai import CompletionRequest

if TYPE_CHECKING:
    from tram.server.handlers.completion import OpenAIServingCompletion


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # generated tokens only (the prompt is not repeated here)
    cum_logprob: float
    text: str | None = None
    finish_reason: str | None = None  # "stop" (ended on EOS) or "length"


def beam_score(seq: BeamSearchSequence, length_penalty: float = 1.0) -> float:
    """vLLM's `get_beam_search_score` form, over the generated length (see the module docstring)."""
    return seq.cum_logprob / (len(seq.tokens) ** length_penalty)


async def _next_token_logprobs(
    engine: Any,
    token_ids: list[int],
    params: SamplingParams,
    request_id: str,
) -> dict[int, Logprob]:
    """Run one single-token request and return the logprobs of its only position.

    `aclosing` guarantees the generator is closed even when this task is cancelled mid-stream, and
    closing an unfinished `generate` stream is what aborts the request inside the engine.
    """
    final = None
    async with aclosing(engine.generate({"prompt_token_ids": token_ids}, params, request_id)) as stream:
        async for out in stream:
            final = out
    if final is None or not final.outputs[0].logprobs:
        raise RuntimeError(f"beam search step {request_id!r} returned no logprobs")
    return final.outputs[0].logprobs[0]


async def _run_step(
    engine: Any,
    prompt_token_ids: list[int],
    beams: list[BeamSearchSequence],
    params: SamplingParams,
    step_id: str,
) -> list[dict[int, Logprob]]:
    """Expand every live beam concurrently; on any failure or cancellation abort the rest."""
    return await gather_or_cancel(
        [
            _next_token_logprobs(engine, prompt_token_ids + beam.tokens, params, f"{step_id}-{i}")
            for i, beam in enumerate(beams)
        ]
    )


def _validate(engine: Any, prompt_token_ids: list[int], beam_width: int, max_tokens: int) -> None:
    if beam_width < 1:
        raise ValueError(f"beam_width must be at least 1, got {beam_width}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if not prompt_token_ids:
        raise ValueError("prompt_token_ids must not be empty")
    # Checked up front so that a bad request fails before any step runs, with a beam-search message.
    max_logprobs = engine.config.max_logprobs
    if 2 * beam_width > max_logprobs:
        raise ValueError(
            f"beam_width={beam_width} needs {2 * beam_width} logprobs per step, more than the "
            f"engine's max_logprobs ({max_logprobs})"
        )
    engine.input_processor.check_prompt_length(len(prompt_token_ids), max_tokens, LengthRule(completion_must_fit=True))


async def beam_search(
    engine: Any,
    prompt_token_ids: list[int],
    beam_width: int,
    max_tokens: int,
    *,
    length_penalty: float = 1.0,
    ignore_eos: bool = False,
    request_id: str,
) -> list[BeamSearchSequence]:
    """Return up to `beam_width` sequences, best score first, with `text` and `finish_reason` set."""
    _validate(engine, prompt_token_ids, beam_width, max_tokens)
    eos_id = engine.eos_token_ids[0] if engine.eos_token_ids else None
    # 2 * beam_width candidates per beam (vLLM's choice): with at most one of them EOS, a beam's own
    # candidates can always refill all beam_width live beams. The text of a step is never used.
    params = SamplingParams(
        max_tokens=1,
        logprobs=2 * beam_width,
        temperature=0.0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )

    def score(seq: BeamSearchSequence) -> float:
        return beam_score(seq, length_penalty)

    live = [BeamSearchSequence(tokens=[], cum_logprob=0.0)]
    completed: list[BeamSearchSequence] = []
    for step in range(max_tokens):
        if not live:
            break
        step_logprobs = await _run_step(engine, prompt_token_ids, live, params, f"{request_id}-beam-{step}")
        candidates: list[BeamSearchSequence] = []
        for beam, logprobs in zip(live, step_logprobs):
            for token_id, lp in logprobs.items():
                seq = BeamSearchSequence(beam.tokens + [token_id], beam.cum_logprob + lp.logprob)
                if token_id == eos_id and not ignore_eos:
                    seq.finish_reason = "stop"
                    completed.append(seq)
                else:
                    candidates.append(seq)
        # All candidates of one step have the same length, so this is also a sort by cum_logprob.
        live = sorted(candidates, key=score, reverse=True)[:beam_width]

    for seq in live:
        seq.finish_reason = "length"
    best = sorted(completed + live, key=score, reverse=True)[:beam_width]
    _detokenize(engine.tokenizer, prompt_token_ids, best)
    return best


def _detokenize(tokenizer: Any | None, prompt_token_ids: list[int], seqs: list[BeamSearchSequence]) -> None:
    """Set `text` exactly as a `generate` request that produced these tokens would have.

    The engine's detokenizer is primed with the prompt, so the first word keeps its leading space
    (a bare `tokenizer.decode(tokens)` strips it with sentencepiece tokenizers) and the EOS that
    ended a beam is left out. No tokenizer (skip_tokenizer_init) leaves `text` as None.
    """
    if tokenizer is None:
        return
    for seq in seqs:
        detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens=True)
        detok.update(seq.tokens, stop_terminated=seq.finish_reason == "stop")
        seq.text = detok.output_text


class BeamSearchCompletion:
    def __init__(self, serving: OpenAIServingCompletion) -> None:
        self.serving = serving

    async def run(self, req: CompletionRequest, request_id: str, prompts: list[tuple[str | None, list[int]]]) -> dict:
        s = self.serving
        # The remaining context when max_tokens is null, as a sampled completion would get.
        searches = [
            beam_search(
                s.engine,
                ids,
                req.n,
                req.max_tokens or s.max_model_len - len(ids),
                length_penalty=req.length_penalty,
                ignore_eos=req.ignore_eos,
                request_id=f"{request_id}-{i}",
            )
            for i, (_, ids) in enumerate(prompts)
        ]
        results = await gather_or_cancel(searches)
        choices, completion_tokens = [], 0
        for i, ((text, ids), beams) in enumerate(zip(prompts, results)):
            for j, beam in enumerate(beams):
                choices.append(self._choice(req, i * req.n + j, text, ids, beam))
                completion_tokens += len(beam.tokens)
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        return {
            "id": request_id,
            "object": "text_completion",
            "created": s.created(),
            "model": s.model_name,
            "choices": choices,
            "usage": s.usage(prompt_tokens, completion_tokens),
        }

    def _choice(
        self, req: CompletionRequest, index: int, prompt: str | None, ids: list[int], beam: BeamSearchSequence
    ) -> dict:
        text = beam.text or ""
        if req.echo:
            prompt_text = prompt if prompt is not None else self.serving.tokenizer.decode(ids)
            text = prompt_text + text
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": beam.finish_reason,
            "stop_reason": None,
        }

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
