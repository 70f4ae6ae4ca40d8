"""Speculative decoding of constrained requests: the engine core trims each request's drafts to what
its grammar accepts, fills a bitmask row for every draft position by stepping its matcher over the
drafts and back, and the rejection sampler verifies under those masks. Outputs stay valid and are
the ones plain decoding gives (greedy, and seeded sampling), with both grammar engines; drafts are
verified, accepted and rejected along the way, and the block pool is clean after each workload."""

from __future__ import annotations

import json
import re
from concurrent.futures import Future

import numpy as np
import pytest
import torch
from api_helpers import assert_no_leak
from conftest import STORIES

from tram import LLM, SamplingParams, StructuredOutputsParams
from tram.structured_output.backend import make_backend
from tram.structured_output.request import StructuredOutputRequest
from tram.worker.logits_processors.grammar_bitmask import GrammarBitmaskProcessor, unpack_bitmask

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
PROMPT = "Tom had a big red ball. Tom had a big red ball. Tom had a big red ball."
# The prompt's sentence again and again (drafts accepted), with choices the prompt does not copy
# (drafts rejected), and a colour it never says (drafts the grammar refuses, trimmed).
REGEX = r"( (Tom|Sue) had a (big|small) (red|blue) ball\.){3,5}"
BLUE = r"( Tom had a big blue ball\.){3}"
SCHEMA = {
    "type": "object",
    "properties": {"toys": {"type": "array", "items": {"enum": ["big red ball", "red ball"]}, "maxItems": 6}},
    "required": ["toys"],
    "additionalProperties": False,
}
CASES = [("regex", REGEX), ("regex", BLUE), ("json", SCHEMA), ("choice", [" Tom had a big red ball.", " Sue"])]


def _params(kind: str, spec, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    so = StructuredOutputsParams(**{kind: spec}, disable_any_whitespace=True)
    return SamplingParams(max_tokens=80, temperature=temperature, seed=seed, structured_outputs=so)


def _valid(kind: str, spec, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in spec
    toys = json.loads(text)["toys"]
    return len(toys) <= 6 and all(t in ("big red ball", "red ball") for t in toys)


@pytest.fixture(scope="module")
def tokenizer(stories_llm: LLM):
    return stories_llm.get_tokenizer()


# ---- the engine core's side, on its own ---------------------------------------------------------
def _request(backend_name: str, tokenizer, regex: str, reasoning_end: list[int] | None = None):
    backend = make_backend(backend_name, tokenizer, 512, [tokenizer.eos_token_id], 1)
    params = StructuredOutputsParams(regex=regex, reasoning_end=reasoning_end)
    compiled: Future = Future()
    compiled.set_result(backend.compile(params))
    state = StructuredOutputRequest(params, compiled, backend, deadline=float("inf"))
    assert state.is_ready()
    return state


def _ids(tokenizer, text: str) -> list[int]:
    """The tokens of `text` as a continuation: sentencepiece's leading word marker is its space."""
    return tokenizer.encode(text.lstrip(" "), add_special_tokens=False)


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_draft_rows_are_the_masks_after_each_draft_and_the_matcher_steps_back(tokenizer, backend):
    ids = _ids(tokenizer, " Tom had a big red ball.")
    state = _request(backend, tokenizer, REGEX)
    words = -(-512 // 32)
    rows = np.full((len(ids) + 1, words), -1, dtype=np.int32)
    state.fill_bitmask(rows, 0, ids)
    # Each row is what a matcher that took the drafts one by one allows next.
    step = _request(backend, tokenizer, REGEX)
    want = np.full_like(rows, -1)
    for j, token in enumerate(ids):
        step.fill_bitmask(want, j)
        assert step.accept_token(token)
    step.fill_bitmask(want, len(ids))
    np.testing.assert_array_equal(rows, want)
    # And the matcher is back where it started: its next row is the first again, the drafts still valid.
    again = np.full((1, words), -1, dtype=np.int32)
    state.fill_bitmask(again, 0)
    np.testing.assert_array_equal(again[0], rows[0])
    assert state.valid_drafts(ids) == len(ids)


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_drafts_are_trimmed_at_the_first_the_grammar_refuses(tokenizer, backend):
    good = _ids(tokenizer, " Tom had a big")
    bad = _ids(tokenizer, " green")
    state = _request(backend, tokenizer, REGEX)
    assert state.valid_drafts(good + bad + good) == len(good)
    assert state.valid_drafts(bad + good) == 0
    # Rows past a refused draft repeat the last one the grammar reached (never read: it cannot be drawn).
    rows = np.full((len(good) + len(bad) + 1, 16), 0, dtype=np.int32)
    state.fill_bitmask(rows, 0, good + bad)
    for j in range(len(good) + 1, len(rows)):
        np.testing.assert_array_equal(rows[j], rows[len(good)])
    assert state.valid_drafts(good) == len(good)  # stepped back


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_draft_run_through_the_grammar_end(tokenizer, backend):
    """Drafts stop being valid after the stop token; the row past it is never all banned (it would
    make the verification's distribution empty), and the matcher steps back over the stop token."""
    state = _request(backend, tokenizer, " Sue")
    sue, eos = _ids(tokenizer, " Sue"), tokenizer.eos_token_id
    drafts = sue + [eos] + sue
    assert state.valid_drafts(drafts) == len(sue) + 1
    rows = np.zeros((len(drafts) + 1, 16), dtype=np.int32)
    state.fill_bitmask(rows, 0, drafts)
    assert all(rows[j].any() for j in range(len(rows)))
    allowed = unpack_bitmask(torch.from_numpy(rows), 512)
    assert allowed[len(sue), eos] and allowed[len(sue)].sum() <= 2  # after " Sue": a stop token only
    assert state.valid_drafts(drafts) == len(sue) + 1 and not state.is_terminated()


def test_a_thinking_request_drafts_up_to_the_end_of_its_thinking(tokenizer):
    end = _ids(tokenizer, " The end")
    state = _request("xgrammar", tokenizer, REGEX, reasoning_end=end)
    words = _ids(tokenizer, " I think")
    assert state.valid_drafts(words + end + words) == len(words) + len(end) - 1
    assert state.valid_drafts(words) == len(words)
    # A thinking request that has said the first part of the end already.
    state.accept_token(end[0])
    assert state.valid_drafts(end[1:] + words) == len(end) - 2


def test_the_processor_hands_each_draft_position_its_mask():
    words, vocab = 2, 64
    proc = GrammarBitmaskProcessor(vocab, torch.device("cpu"))
    masks = np.arange(1, 9, dtype=np.int32).reshape(4, words) * 3  # distinct rows
    plain = np.full((1, words), 5, dtype=np.int32)
    # Batch row 2 verifies 2 drafts (3 rows), batch row 0 none (1 row), batch row 5 none.
    proc.set_step([2, 0, 5], np.concatenate([masks[:3], plain, masks[3:]]), [3, 1, 1])
    assert proc.bitmask.tolist() == [masks[2].tolist(), plain[0].tolist(), masks[3].tolist()]
    drafted_rows, counts = [4, 2], [1, 2]  # row 4 has no grammar
    penalty = proc.draft_penalty(drafted_rows, counts, last=False, vocab_size=vocab)
    allowed = penalty == 0
    assert allowed[0].all()
    assert torch.equal(allowed[1:], unpack_bitmask(torch.from_numpy(masks[:2]), vocab))
    last = proc.draft_penalty(drafted_rows, counts, last=True, vocab_size=vocab) == 0
    assert last[0].all() and torch.equal(last[1], unpack_bitmask(torch.from_numpy(masks[2:3]), vocab)[0])
    assert proc.draft_penalty([4], [3], last=False, vocab_size=vocab) is None


# ---- end to end -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _drafts_whatever_the_timing():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
        yield


@pytest.fixture(scope="module", params=["xgrammar", "guidance"])
def engines(request: pytest.FixtureRequest, _drafts_whatever_the_timing, stories_llm: LLM):
    """(grammar engine, plain LLM, speculative LLM); the shared engine is xgrammar's plain one."""
    backend = request.param
    spec = LLM(STORIES, max_num_seqs=16, speculative_config=NGRAM, structured_outputs_backend=backend)
    plain = stories_llm if backend == "xgrammar" else LLM(STORIES, max_num_seqs=16, structured_outputs_backend=backend)
    yield backend, plain, spec
    for engine in (spec,) if plain is stories_llm else (plain, spec):
        assert_no_leak(engine.llm_engine)
        engine.llm_engine.engine_core.shutdown()


def _counts(llm: LLM) -> tuple[int, int, int]:
    c = llm.llm_engine.get_stats().spec_decoding
    return (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) if c is not None else (0, 0, 0)


def test_constrained_greedy_and_seeded_outputs_are_plain_decodings(engines):
    _, plain, spec = engines
    params = [_params(kind, s) for kind, s in CASES]
    params += [_params(kind, s, temperature=1.0, seed=11 + i) for i, (kind, s) in enumerate(CASES)]
    before = _counts(spec)
    got = spec.generate([PROMPT] * len(params), params, use_tqdm=False)
    want = plain.generate([PROMPT] * len(params), params, use_tqdm=False)
    drafts, draft_tokens, accepted = (a - b for a, b in zip(_counts(spec), before))
    assert drafts > 0 and 0 < accepted < draft_tokens, "drafts were verified, some accepted and some rejected"
    for (kind, s), g, w in zip(CASES + CASES, got, want):
        g, w = g.outputs[0], w.outputs[0]
        assert (g.token_ids, g.finish_reason) == (w.token_ids, w.finish_reason), (kind, g.text, w.text)
        assert g.finish_reason == "stop" and _valid(kind, s, g.text), (kind, g.text)


def test_constrained_requests_beside_free_ones_chunked_and_preempted(engines):
    backend, plain, _ = engines
    params = [_params("regex", REGEX), SamplingParams(temperature=0, max_tokens=60), _params("json", SCHEMA)] * 2
    prompts = [PROMPT + " Tom" * i for i in range(len(params))]
    want = plain.generate(prompts, params, use_tqdm=False)
    small = LLM(
        STORIES,
        max_num_seqs=3,
        enable_prefix_caching=False,
        max_model_len=160,
        num_gpu_blocks_override=14,
        max_num_batched_tokens=24,
        speculative_config=NGRAM,
        structured_outputs_backend=backend,
    )
    got = small.generate(prompts, params, use_tqdm=False)
    stats = small.llm_engine.get_stats()
    assert_no_leak(small.llm_engine)
    small.llm_engine.engine_core.shutdown()
    assert stats.num_preemptions > 0 and stats.spec_decoding.num_accepted_tokens > 0
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids


def test_a_draft_model_drafts_constrained_requests_too(stories_llm: LLM):
    """A draft model's proposals (which know no grammar) are cut to what the grammar accepts too; the
    draft is the target itself, so every draft the grammar keeps is accepted."""
    spec = LLM(
        STORIES,
        max_num_seqs=8,
        speculative_config={"method": "draft_model", "model": STORIES, "num_speculative_tokens": 3},
    )
    params = [_params(kind, s) for kind, s in CASES]
    try:
        got = spec.generate([PROMPT] * len(params), params, use_tqdm=False)
        drafts, draft_tokens, accepted = _counts(spec)
        assert_no_leak(spec.llm_engine)
    finally:
        spec.llm_engine.engine_core.shutdown()
    want = stories_llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    assert drafts > 0 and accepted == draft_tokens > 0
    for (kind, s), g, w in zip(CASES, got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids and _valid(kind, s, g.outputs[0].text), kind
