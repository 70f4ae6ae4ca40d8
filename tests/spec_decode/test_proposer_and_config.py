"""The n-gram proposer on hand-made contexts, and speculative_config's refusals at start."""

from __future__ import annotations

import numpy as np
import pytest

import tram.spec_decode  # noqa: F401 - registers the methods
from tram.config import EngineArgs
from tram.config.speculative import SpeculativeConfig, parse_speculative_config
from tram.spec_decode import make_proposer
from tram.spec_decode.ngram import NgramProposer


def _proposer(k: int = 4, low: int = 2, high: int = 4) -> NgramProposer:
    return make_proposer(SpeculativeConfig("ngram", k, low, high))


@pytest.mark.parametrize(
    "context, expected",
    [
        ([1, 2, 3, 4, 5, 6, 1, 2, 3], [4, 5, 6, 1]),  # the 3-gram 1 2 3 recurs
        ([1, 2, 3, 4, 5, 6, 9, 2, 3], [4, 5, 6, 9]),  # only the 2-gram 2 3 does
        ([1, 2, 3, 9, 3], []),  # a 1-gram is below prompt_lookup_min
        ([5, 5, 5, 5], [5, 5, 5, 5]),  # 5 5 5 ends at 2: a loop of period 1, followed around
        ([7, 8, 1, 7, 8, 2, 7, 8], [2, 7, 8, 2]),  # the latest occurrence wins; a loop of period 3
        ([3], []),
    ],
)
def test_ngram_proposes_what_followed_the_latest_match(context, expected):
    assert _proposer().propose(np.array(context, dtype=np.int32)) == expected


def test_ngram_prefers_the_longest_match_and_respects_the_cap():
    # The 2-gram 4 5 last occurs at 6..7 (followed by 0), the 3-gram 3 4 5 only at 0..2 (followed by 9).
    context = np.array([3, 4, 5, 9, 9, 1, 4, 5, 0, 3, 4, 5], dtype=np.int32)
    assert _proposer(k=2).propose(context) == [9, 9]
    assert _proposer(k=2, low=2, high=2).propose(context) == [0, 3]
    assert _proposer(k=4).propose(context, max_tokens=1) == [9]
    assert _proposer(k=4).propose(context, max_tokens=0) == []


def test_config_defaults_and_refusals():
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert spec == SpeculativeConfig("ngram", 3, 5, 5)
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}) == (
        SpeculativeConfig("ngram", 2, 3, 3)
    )
    bad = [
        ({"method": "medusa", "num_speculative_tokens": 2}, "medusa.*not supported.*ngram"),
        ({"num_speculative_tokens": 2}, "needs a method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, r"1\.\.16"),
        ({"method": "ngram", "num_speculative_tokens": 17}, r"1\.\.16"),
        ({"method": "ngram"}, r"1\.\.16"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "integer"),
        ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "<="),
        ({"method": "ngram", "num_speculative_tokens": 4, "lookahead": 2}, "unknown key"),
        ({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 0}, "positive"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
    ]
    for value, match in bad:
        with pytest.raises(ValueError, match=match):
            parse_speculative_config(value)


def test_engine_args_refuse_a_bad_config_before_loading():
    args = EngineArgs(model="unused", speculative_config={"method": "ngram", "num_speculative_tokens": 99})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        args.validate()


def test_cli_takes_the_json_object(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert EngineArgs.from_cli_args(ns).speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "--speculative-config", "ngram"])


def test_switch_drafts_where_drafting_has_been_faster():
    from tram.spec_decode.budget import MIN_STEPS, WARMUP_STEPS, DraftSwitch

    switch = DraftSwitch(explore_every=10)
    # One request: a drafting step makes 3 tokens in 1.2 ms, a plain one 1 token in 1 ms. 64 requests:
    # drafting makes 200 tokens in 20 ms, plain 64 in 5 ms.
    rates = {(1, True): (3, 1.2e-3), (1, False): (1, 1e-3), (64, True): (200, 20e-3), (64, False): (64, 5e-3)}
    choices: dict[int, list[bool]] = {1: [], 64: []}
    for _ in range(200):
        for rows in (1, 64):
            side = switch.should_draft(rows)
            choices[rows].append(side)
            switch.record_step(rows, side, *rates[(rows, side)])
    first = WARMUP_STEPS + MIN_STEPS
    assert choices[1][:first] == [True] * first and choices[64][:first] == [True] * first, "drafting is tried first"
    late = {rows: c[100:] for rows, c in choices.items()}
    assert sum(late[1]) > 0.85 * len(late[1]), "one request: drafting pays"
    assert sum(late[64]) < 0.15 * len(late[64]), "64 requests: it does not"
    assert 0 < sum(late[64]), "the losing side is still tried now and then"


def test_switch_explores_in_runs_for_a_model_proposer():
    from tram.spec_decode.budget import DraftSwitch

    switch = DraftSwitch(explore_every=32, explore_run=3)
    choices = []
    for _ in range(300):  # plain decoding is twice as fast: drafting is only explored
        side = switch.should_draft(1)
        choices.append(side)
        switch.record_step(1, side, 1, 2e-3 if side else 1e-3)
    late = "".join("d" if c else "." for c in choices[150:])
    runs = [len(r) for r in late.split(".") if r]
    assert runs and all(n == 3 for n in runs[1:-1]), late


def test_switch_trusts_a_smaller_batch_where_drafting_lost_clearly():
    """Drafting five times slower at one request: at 64 it is not tried first, and then only at the
    pace that keeps its tries under EXPLORE_COST of the throughput."""
    from tram.spec_decode.budget import EXPLORE_COST, DraftSwitch

    switch = DraftSwitch(explore_every=32, explore_run=1)
    for _ in range(40):
        side = switch.should_draft(1)
        switch.record_step(1, side, 1, 5e-3 if side else 1e-3)
    choices = []
    for _ in range(400):
        side = switch.should_draft(64)
        choices.append(side)
        switch.record_step(64, side, 64, 5e-3 * 64 / 10 if side else 1e-3 * 64 / 10)
    assert not any(choices[:50]), "not tried first"
    assert 0 < sum(choices) and sum(choices) * 4 <= EXPLORE_COST * len(choices) + 4


def test_switch_tries_a_clearly_slower_side_at_the_clear_cost():
    """Plain decoding 2.5 times slower than drafting at one request (n-gram on copies): it is still
    tried, but its tries cost at most CLEAR_COST of the throughput, not EXPLORE_COST."""
    from tram.spec_decode.budget import CLEAR_COST, EXPLORE_COST, DraftSwitch

    assert CLEAR_COST < EXPLORE_COST
    switch = DraftSwitch()
    plain = 0
    for step in range(3000):
        side = switch.should_draft(1)
        plain += step >= 100 and not side
        switch.record_step(1, side, 3 if side else 1, 1.2e-3 if side else 1e-3)
    # Each plain step costs 1.5 drafting steps' worth of tokens lost over 2.5.
    assert 0 < plain and plain * (2.5 - 1) <= CLEAR_COST * 2900 * 1.1
