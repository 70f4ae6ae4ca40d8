"""The draft-model proposer: its K/V shares the target's blocks and computed counts, and its
proposals fill the scheduler's lookahead slots. With the target itself as the draft, every greedy
draft must be accepted: any slot the draft missed or read stale (a prompt chunk, a prefix-cache hit,
a recompute after preemption, the end of the context) would show as a rejection. The start-up
refusals are one line each."""

from __future__ import annotations

import json
import shutil

import pytest
from api_helpers import assert_no_leak
from conftest import STORIES

from tram import LLM, SamplingParams
from tram.config import EngineArgs
from tram.engine.engine_config import create_engine_config

MAX_LEN = 160
SMALL = {"max_num_seqs": 3, "num_gpu_blocks_override": 24, "max_num_batched_tokens": 24, "max_model_len": MAX_LEN}


def test_the_target_as_its_own_draft_accepts_every_greedy_draft(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
    spec = {"method": "draft_model", "model": STORIES, "num_speculative_tokens": 3}
    drafted = LLM(STORIES, speculative_config=spec, **SMALL)
    plain = LLM(STORIES, **SMALL)
    try:
        tok = plain.get_tokenizer()
        story = tok.encode("Once upon a time, there was a little girl named Lily. She liked to play outside.")
        # Chunked prompts; the same prompt again (a prefix-cache hit); requests that run into the
        # context's end; and blocks for a third of what they ask, so they preempt each other.
        prompts = [story, story, story[:20] * 3, tok.encode("Tom and his dog"), story * 2]
        params = SamplingParams(temperature=0, max_tokens=MAX_LEN, ignore_eos=True)
        got = drafted.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        want = plain.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        assert all(len(p) + len(o.outputs[0].token_ids) == MAX_LEN for p, o in zip(prompts, got))
        stats = drafted.llm_engine.get_stats()
        counts = stats.spec_decoding
        assert stats.num_preemptions > 0 and any(o.num_cached_tokens > 0 for o in got)
        assert counts.num_draft_tokens > 0 and counts.num_accepted_tokens == counts.num_draft_tokens
        assert_no_leak(drafted.llm_engine)
    finally:
        drafted.llm_engine.engine_core.shutdown()
        plain.llm_engine.engine_core.shutdown()


def _config(spec: dict) -> None:
    create_engine_config(EngineArgs(model=STORIES, speculative_config=spec))


def test_refusals_at_start(tmp_path):
    with pytest.raises(ValueError, match="'draft_model' needs a model"):
        _config({"method": "draft_model", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="'ngram' takes no model"):
        _config({"method": "ngram", "num_speculative_tokens": 3, "model": STORIES})
    other = tmp_path / "other-vocab"
    shutil.copytree(STORIES, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 1024}))
    with pytest.raises(ValueError, match=r"vocabulary \(1024 tokens\) is not the target's \(512\)"):
        _config({"method": "draft_model", "model": str(other), "num_speculative_tokens": 3})
    (other / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    with pytest.raises(ValueError, match="the draft model .*max_model_len 512 is larger"):
        _config({"method": "draft_model", "model": str(other), "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="speculative_config model must be a path"):
        _config({"method": "draft_model", "model": 3, "num_speculative_tokens": 3})


def test_the_draft_catches_up_over_the_steps_it_sat_out(monkeypatch: pytest.MonkeyPatch):
    """From two requests on nothing is drafted (disable_by_batch_size), and the draft model does not
    run; once one request is left, the draft first computes the positions it missed: with the target
    as its own draft, every draft is then accepted, which stale K/V would not allow."""
    monkeypatch.setenv("TRAM_SPEC_DRAFT_SWITCH", "0")
    spec = {"method": "draft_model", "model": STORIES, "num_speculative_tokens": 3, "disable_by_batch_size": 2}
    drafted = LLM(STORIES, speculative_config=spec, max_num_seqs=3, max_model_len=MAX_LEN)
    plain = LLM(STORIES, max_num_seqs=3, max_model_len=MAX_LEN)
    try:
        tok = plain.get_tokenizer()
        story = tok.encode("Once upon a time, there was a little girl named Lily.")
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (10, 30, 90)]
        prompts = [{"prompt_token_ids": story + [i + 10]} for i in range(3)]
        got = drafted.generate(prompts, params, use_tqdm=False)
        want = plain.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        counts = drafted.llm_engine.get_stats().spec_decoding
        produced_alone = 90 - 30  # the tokens the last request makes alone, where drafting is allowed
        assert 0 < counts.num_drafts < produced_alone
        assert counts.num_accepted_tokens == counts.num_draft_tokens
        assert_no_leak(drafted.llm_engine)
    finally:
        drafted.llm_engine.engine_core.shutdown()
        plain.llm_engine.engine_core.shutdown()
