"""Beam search (tram.server.handlers.beam_search) on the real stories260K model through AsyncLLM.

One engine (a spawned core process, ~5 s to start) serves the whole module. Its asyncio objects are
bound to the loop it started on, so the module owns one event loop and runs every test's coroutine
on it. After every test the engine must be clean: no request left in the front end or the core, no
KV block in use, and an intact block pool.

Oracles:
- Greedy decoding (`beam_width=1` must be exactly greedy).
- transformers' `generate(num_beams=k)`. Its rules coincide with vLLM's only when no EOS competes:
  it admits a finished hypothesis only when its EOS is among the best `num_beams` of the step's
  `2 * num_beams` candidates, while vLLM (and tram) admit every EOS in each beam's top
  `2 * beam_width`, so with an EOS in play HF can miss a better-scoring finished sequence (on
  "She was happy", k=3, length_penalty=0, ending at once on "." scores -3.20; HF returns -4.73).
  The real stories260K EOS (</s>) never reaches the top 2k, so on it HF is an exact oracle, given
  `early_stopping="never"` (the only mode whose stop rule is exact: the default heuristic may stop
  while a longer beam could still win when length_penalty > 0). The installed transformers (5.x)
  divides by the generated length, EOS included, as tram does.
- For the EOS path, an independent reference written over the full vocabulary with HF logits and
  the vLLM admission rule, run with "." relabelled as the EOS so that beams do end early.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import aclosing
from typing import Any

import pytest
import torch
from conftest import STORIES, hf_model

from tram.config import EngineArgs
from tram.engine.async_llm import AsyncLLM
from tram.engine.engine_config import create_engine_config
from tram.sampling_params import SamplingParams
from tram.server.handlers.beam_search import BeamSearchSequence, beam_score, beam_search

PERIOD = 426  # "." : relabelled as the EOS where a test needs beams that end early
SCORE_TOL = 2e-3  # engine vs transformers float32 logprobs, summed over a few tokens


@pytest.fixture(scope="module")
def loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop: asyncio.AbstractEventLoop) -> AsyncLLM:
    eng = AsyncLLM(create_engine_config(EngineArgs(STORIES)))
    loop.run_until_complete(eng.start())
    yield eng
    eng.shutdown()


@pytest.fixture(autouse=True)
def engine_clean_after(engine: AsyncLLM, loop: asyncio.AbstractEventLoop):
    yield
    loop.run_until_complete(assert_engine_clean(engine))


async def assert_engine_clean(engine: AsyncLLM) -> None:
    """Nothing left running anywhere. Aborts and utility calls share one ordered channel, so the
    stats already reflect every abort sent before them."""
    assert not engine.collectors
    assert not engine.output_processor.requests
    counts = await engine.check_kv_integrity()
    assert counts["in_use"] == 0, counts
    stats = await engine.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0, stats
    assert stats.kv_cache_usage == 0, stats


class EngineView:
    """The real engine seen with another EOS id, recording how the step requests ran.

    `fail_on` makes that request fail at once; requests starting with `stall_prefix` never hand over
    their (finished) output, so they are certainly still open when the search has to give up on them.
    """

    def __init__(
        self, engine: AsyncLLM, eos: int | None = None, fail_on: str | None = None, stall_prefix: str | None = None
    ) -> None:
        self._engine = engine
        self.eos_token_ids = [eos] if eos is not None else engine.eos_token_ids
        self.fail_on, self.stall_prefix = fail_on, stall_prefix
        self.open_now = self.max_open = self.stalled = 0
        self.started: list[str] = []
        self.closed_early: list[str] = []
        self.cached_tokens: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt: Any, params: SamplingParams, request_id: str):
        if request_id == self.fail_on:
            raise RuntimeError(f"injected failure in {request_id}")
        self.started.append(request_id)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        finished = False
        try:
            # aclosing: closing this wrapper early must close (and so abort) the real stream too.
            async with aclosing(self._engine.generate(prompt, params, request_id)) as stream:
                async for out in stream:
                    self.cached_tokens[request_id] = out.num_cached_tokens
                    if self.stall_prefix and request_id.startswith(self.stall_prefix):
                        self.stalled += 1
                        await asyncio.Event().wait()  # until cancelled
                    finished = out.finished
                    yield out
        finally:
            self.open_now -= 1
            if not finished:
                self.closed_early.append(request_id)


def ids_of(engine: AsyncLLM, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text))


async def greedy(engine: AsyncLLM, prompt_ids: list[int], n: int, request_id: str):
    params = SamplingParams(temperature=0.0, max_tokens=n, logprobs=0)
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt_ids}, params, request_id):
        final = out
    return final.outputs[0]


def hf_beam_search(prompt_ids: list[int], k: int, n: int, length_penalty: float) -> tuple[list[list[int]], list[float]]:
    model = hf_model(STORIES)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            num_beams=k,
            num_return_sequences=k,
            do_sample=False,
            length_penalty=length_penalty,
            max_new_tokens=n,
            max_length=None,
            early_stopping="never",
            eos_token_id=2,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return [row[len(prompt_ids) :].tolist() for row in out.sequences], out.sequences_scores.tolist()


def hf_beam_search_with_eos(prompt_ids: list[int], k: int, n: int, length_penalty: float):
    model = hf_model(STORIES)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            num_beams=k,
            do_sample=False,
            length_penalty=length_penalty,
            max_new_tokens=n,
            max_length=None,
            early_stopping="never",
            eos_token_id=PERIOD,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, len(prompt_ids) :].tolist(), out.sequences_scores.tolist()


def reference_beam_search(
    prompt_ids: list[int],
    k: int,
    n: int,
    length_penalty: float,
    eos: int,
) -> list[tuple[list[int], float, str]]:
    """Beam search over the whole [beams, vocab] matrix of HF logprobs (no engine, no dicts).

    Same rules as vLLM: an EOS within its beam's top 2k ends that hypothesis; the k best non-EOS
    extensions of all beams live on; at the end everything is ranked by cum / gen_len ** penalty.
    """
    model = hf_model(STORIES)
    live: list[tuple[list[int], float]] = [([], 0.0)]
    done: list[tuple[list[int], float, str]] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + toks for toks, _ in live])).logits[:, -1].float()
        rows = torch.log_softmax(logits, dim=-1)
        cum = rows + torch.tensor([c for _, c in live], dtype=torch.float64)[:, None]
        eos_rank = (rows > rows[:, eos : eos + 1]).sum(dim=-1)  # 0-based rank of EOS in its beam
        for b in torch.nonzero(eos_rank < 2 * k).flatten().tolist():
            done.append((live[b][0] + [eos], cum[b, eos].item(), "stop"))
        cum[:, eos] = -math.inf
        vals, flat = cum.flatten().topk(k)
        vocab = rows.shape[-1]
        live = [(live[i // vocab][0] + [i % vocab], v) for v, i in zip(vals.tolist(), flat.tolist())]
    ranked = done + [(toks, c, "length") for toks, c in live]
    ranked.sort(key=lambda r: r[1] / len(r[0]) ** length_penalty, reverse=True)
    return ranked[:k]


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("text, leading_space", [("Once upon a time", False), ("Lily went to the park.", True)])
def test_width_one_is_greedy(engine: AsyncLLM, loop: asyncio.AbstractEventLoop, text: str, leading_space: bool) -> None:
    ids = ids_of(engine, text)
    want = loop.run_until_complete(greedy(engine, ids, 16, f"greedy-{text}"))
    assert want.finish_reason == "length"  # stories260K runs long: no EOS inside 16 tokens
    [got] = loop.run_until_complete(beam_search(engine, ids, 1, 16, request_id=f"w1-{text}"))
    assert got.tokens == want.token_ids
    assert got.cum_logprob == pytest.approx(want.cumulative_logprob, abs=1e-4)
    # Text as generate renders it: primed with the prompt, so a leading space is kept.
    assert got.text == want.text and got.finish_reason == "length"
    assert got.text.startswith(" ") == leading_space


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_matches_transformers_beam_search(
    engine: AsyncLLM, loop: asyncio.AbstractEventLoop, k: int, length_penalty: float
) -> None:
    text = "Once upon a time" if k % 2 else "One day"
    ids = ids_of(engine, text)
    got = loop.run_until_complete(
        beam_search(engine, ids, k, 8, length_penalty=length_penalty, request_id=f"hf-{k}-{length_penalty}")
    )
    want_tokens, want_scores = hf_beam_search(ids, k, 8, length_penalty)
    assert all(s.finish_reason == "length" for s in got)  # the EOS never competed
    # Not just the top sequence: all k agree, in order, with HF's own scores.
    assert [s.tokens for s in got] == want_tokens
    assert [beam_score(s, length_penalty) for s in got] == pytest.approx(want_scores, abs=SCORE_TOL)


@pytest.mark.parametrize(
    "text, k, length_penalty",
    [
        ("She was happy", 3, 0.0),  # ending at once on "." wins; HF's rule misses it (module docstring)
        ("She was happy", 4, 1.0),
        ("Tom had a big red ball", 4, -1.0),
        ("Tom had a big red ball", 2, 1.0),
    ],
)
def test_eos_path_matches_reference(
    engine: AsyncLLM, loop: asyncio.AbstractEventLoop, text: str, k: int, length_penalty: float
) -> None:
    view = EngineView(engine, eos=PERIOD)
    ids = ids_of(engine, text)
    got = loop.run_until_complete(
        beam_search(view, ids, k, 10, length_penalty=length_penalty, request_id=f"eos-{text}-{k}-{length_penalty}")
    )
    want = reference_beam_search(ids, k, 10, length_penalty, PERIOD)
    assert [(s.tokens, s.finish_reason) for s in got] == [(t, r) for t, _, r in want]
    assert [s.cum_logprob for s in got] == pytest.approx([c for _, c, _ in want], abs=SCORE_TOL)
    stopped = [s for s in got if s.finish_reason == "stop"]
    assert stopped and all(s.tokens[-1] == PERIOD and len(s.tokens) < 10 for s in stopped)
    # The ending EOS counts in the score but stays out of the text, as generate renders it.
    assert all(not s.text.endswith(".") for s in stopped)
    # HF searches the same live beams but admits fewer finished ones, so it never scores higher.
    _, hf_scores = hf_beam_search_with_eos(ids, k, 10, length_penalty)
    assert beam_score(got[0], length_penalty) >= hf_scores[0] - SCORE_TOL


def test_ignore_eos_continues_past_eos(engine: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
    view = EngineView(engine, eos=PERIOD)
    ids = ids_of(engine, "She was happy")
    got = loop.run_until_complete(beam_search(view, ids, 3, 10, ignore_eos=True, request_id="ignore-eos"))
    assert all(s.finish_reason == "length" and len(s.tokens) == 10 for s in got)
    # With EOS ignored the "." is an ordinary token, i.e. the search HF runs with the real EOS.
    want_tokens, _ = hf_beam_search(ids, 3, 10, 1.0)
    assert [s.tokens for s in got] == want_tokens
    assert any(PERIOD in s.tokens for s in got)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_sorted_distinct_and_not_worse_than_greedy(
    engine: AsyncLLM, loop: asyncio.AbstractEventLoop, length_penalty: float
) -> None:
    ids = ids_of(engine, "The cat")
    [g] = loop.run_until_complete(
        beam_search(engine, ids, 1, 10, length_penalty=length_penalty, request_id=f"sort-g-{length_penalty}")
    )
    for k in (2, 5):
        got = loop.run_until_complete(
            beam_search(engine, ids, k, 10, length_penalty=length_penalty, request_id=f"sort-{k}-{length_penalty}")
        )
        scores = [beam_score(s, length_penalty) for s in got]
        assert len(got) == k and scores == sorted(scores, reverse=True)
        assert len({tuple(s.tokens) for s in got}) == k
        assert scores[0] >= beam_score(g, length_penalty) - 1e-6


def test_step_requests_run_concurrently_on_cached_prefixes(engine: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
    view = EngineView(engine)
    ids = ids_of(engine, "Once upon a time, there was a little girl named Lily. She loved to play outside")
    assert len(ids) > 16  # at least one full KV block of shared prompt
    loop.run_until_complete(beam_search(view, ids, 4, 6, request_id="conc"))
    # Step 0 has one beam, every later step four: all four were in flight together.
    assert len(view.started) == 1 + 5 * 4 and view.max_open == 4
    assert not view.closed_early
    later = [rid for rid in view.started if not rid.startswith("conc-beam-0-")]
    assert all(view.cached_tokens[rid] >= 16 for rid in later)


def test_cancellation_closes_in_flight_steps(engine: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
    view = EngineView(engine, stall_prefix="cancel-beam-2-")
    ids = ids_of(engine, "Once upon a time")

    async def run_and_cancel() -> None:
        task = asyncio.create_task(beam_search(view, ids, 4, 200, request_id="cancel"))
        while view.stalled < 4:  # all four requests of step 2 are open
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    loop.run_until_complete(run_and_cancel())
    assert view.open_now == 0
    assert sorted(view.closed_early) == [f"cancel-beam-2-{i}" for i in range(4)]
    assert not any(rid.startswith("cancel-beam-3-") for rid in view.started)


def test_step_failure_propagates_and_closes_siblings(engine: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
    view = EngineView(engine, fail_on="fail-beam-2-1", stall_prefix="fail-beam-2-")
    ids = ids_of(engine, "Once upon a time")
    with pytest.raises(RuntimeError, match="injected failure"):
        loop.run_until_complete(beam_search(view, ids, 3, 8, request_id="fail"))
    # The siblings of the failed request were still open: the search closed them before raising.
    assert view.open_now == 0
    assert sorted(view.closed_early) == ["fail-beam-2-0", "fail-beam-2-2"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beam_width=0, max_tokens=4), "beam_width"),
        (dict(beam_width=2, max_tokens=0), "max_tokens"),
        (dict(beam_width=11, max_tokens=4), "max_logprobs"),  # 22 logprobs per step > 20
        (dict(beam_width=2, max_tokens=600), "maximum model length"),
    ],
)
def test_invalid_arguments(engine: AsyncLLM, loop: asyncio.AbstractEventLoop, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        loop.run_until_complete(beam_search(engine, [1, 2, 3], request_id="bad", **kwargs))


def test_sequence_defaults() -> None:
    seq = BeamSearchSequence(tokens=[5, 6], cum_logprob=-3.0)
    assert seq.text is None and seq.finish_reason is None
    assert beam_score(seq, 1.0) == -1.5 and beam_score(seq, 0.0) == -3.0
