"""Prefix caching on the real model: hits are counted in tokens and never change the output."""

from __future__ import annotations

import pytest

from tram import SamplingParams

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

PREFIX_TEXT = (
    "Sam had a small red boat. Every morning he took the boat to the pond near his house and "
    "watched the ducks swim around it. His sister Mia liked to come too, and she always brought "
    "bread for the ducks. One sunny day,"
)


def test_prefix_cache_hit_keeps_greedy_output(llm, small, ref):
    tok = ref["tok"]
    a_ids = tok.encode(PREFIX_TEXT + " Sam saw a big frog.")
    b_ids = tok.encode(PREFIX_TEXT + " Mia found a shiny stone.")
    common = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
    assert common >= 48, "the shared prefix must cover at least three blocks of 16"
    params = SamplingParams(temperature=0, max_tokens=30)
    engine = llm.llm_engine
    before = engine.get_stats()
    out_a = llm.generate({"prompt_token_ids": a_ids}, params, use_tqdm=False)[0]
    mid = engine.get_stats()
    out_b = llm.generate({"prompt_token_ids": b_ids}, params, use_tqdm=False)[0]
    after = engine.get_stats()
    assert out_a.num_cached_tokens == 0
    assert out_b.num_cached_tokens == common // 16 * 16 >= 48
    assert after.prefix_cache_hits - mid.prefix_cache_hits == out_b.num_cached_tokens
    assert mid.prefix_cache_hits == before.prefix_cache_hits
    assert after.prefix_cache_queries - mid.prefix_cache_queries == len(b_ids)

    plain = small.generate([{"prompt_token_ids": a_ids}, {"prompt_token_ids": b_ids}], params, use_tqdm=False)
    assert [o.num_cached_tokens for o in plain] == [0, 0]
    assert out_a.outputs[0].token_ids == plain[0].outputs[0].token_ids
    assert out_b.outputs[0].token_ids == plain[1].outputs[0].token_ids
    assert out_b.outputs[0].text == plain[1].outputs[0].text
    assert small.llm_engine.get_stats().prefix_cache_hits == 0
