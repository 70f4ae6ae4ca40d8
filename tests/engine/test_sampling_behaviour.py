"""SamplingParams end to end: n samples, stop strings and stop ids, eos, min_tokens, lengths,
special tokens and detokenize=False."""

from __future__ import annotations

import pytest
from api_helpers import EOS_IDS, PROMPT, random_prompt

from tram import SamplingParams

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

# ---------------------------------------------------------------------------------- n > 1


def test_n_seeded_samples_differ_and_the_call_is_reproducible(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=1234, max_tokens=24)
    a = llm.generate([PROMPT, "Tom and his dog"], params, use_tqdm=False)
    b = llm.generate([PROMPT, "Tom and his dog"], params, use_tqdm=False)
    for out_a, out_b in zip(a, b):
        assert out_a.finished
        assert [c.index for c in out_a.outputs] == [0, 1, 2, 3]
        samples = [tuple(c.token_ids) for c in out_a.outputs]
        assert len(set(samples)) == 4, "seeded samples of one request must differ"
        assert samples == [tuple(c.token_ids) for c in out_b.outputs]
        assert [c.text for c in out_a.outputs] == [c.text for c in out_b.outputs]
    # The same seed in a different batch (alone) gives the same samples.
    alone = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert [c.token_ids for c in alone.outputs] == [c.token_ids for c in a[0].outputs]


def test_n_greedy_samples_equal_the_single_greedy_output(llm, ref):
    out = llm.generate(PROMPT, SamplingParams(n=3, temperature=0, max_tokens=40), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert c.token_ids == ref["once"]
        assert c.finish_reason == "length"
    assert len({c.text for c in out.outputs}) == 1


# ------------------------------------------------------------------------------ stopping


def test_stop_string_excluded(llm, ref):
    tok = ref["tok"]
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop="Lily"), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == "Lily"
    assert c.text == ", there was a little girl named "
    # Tokens up to and including the one that completed the stop string (" Lily" is index 9).
    assert c.token_ids == ref["once"][:10]
    assert tok.convert_ids_to_tokens(c.token_ids[-1]) == "\u2581Lily"


def test_stop_string_included_and_cut_inside_a_token(llm, ref):
    sp = SamplingParams(temperature=0, max_tokens=40, stop=["zzz", "Lil"], include_stop_str_in_output=True)
    c = llm.generate(PROMPT, sp, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == "Lil"
    assert c.text == ", there was a little girl named Lil"
    assert c.token_ids == ref["once"][:10]
    sp = SamplingParams(temperature=0, max_tokens=40, stop=["girl named"])
    c = llm.generate(PROMPT, sp, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.stop_reason) == (", there was a little ", "girl named")


def test_stop_string_never_seen_runs_to_length(llm, ref):
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=["qqqq"]), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and c.stop_reason is None
    assert c.token_ids == ref["once"]


def test_stop_token_ids(llm, ref):
    tok = ref["tok"]
    period = 426
    k = ref["once"].index(period)
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[period]), use_tqdm=False)[
        0
    ].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == period
    assert c.token_ids == ref["once"][: k + 1]
    # Like vLLM, the stop token itself is not rendered.
    full = tok.decode(tok.encode(PROMPT) + ref["once"][:k], skip_special_tokens=True)
    assert c.text == full[len(PROMPT) :] and not c.text.endswith(".")


def test_eos_stops_with_reason(llm, ref):
    c = llm.generate(
        {"prompt_token_ids": ref["story_end"]}, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False
    )[0].outputs[0]
    # BOS is a generation-config eos, so it is reported as the stop reason (as in vLLM).
    assert c.token_ids == [1] and c.finish_reason == "stop" and c.stop_reason == 1
    assert c.text == ""


def test_ignore_eos_gives_exactly_max_tokens(llm, ref):
    c = llm.generate(
        {"prompt_token_ids": ref["story_end"]},
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(c.token_ids) == 7 and c.finish_reason == "length" and c.stop_reason is None
    assert c.token_ids[0] == 1  # the eos it ignored


def test_min_tokens_masks_eos(llm, ref):
    c = llm.generate(
        {"prompt_token_ids": ref["story_end"]},
        SamplingParams(temperature=0, max_tokens=30, min_tokens=10),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(c.token_ids) >= 10
    assert not EOS_IDS & set(c.token_ids[:10])


def test_min_tokens_masks_stop_token_ids(llm, ref):
    period = 426
    assert ref["once"].index(period) < 14
    c = llm.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=40, min_tokens=14, stop_token_ids=[period]), use_tqdm=False
    )[0].outputs[0]
    assert len(c.token_ids) >= 14
    assert period not in c.token_ids[:13]
    if c.finish_reason == "stop":
        assert c.token_ids[-1] in {period} | EOS_IDS and period not in c.token_ids[:-1]


def test_max_tokens_none_runs_to_the_context_limit(llm, ref):
    prompt = (ref["story_end"] * 2)[:470]
    c = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    assert len(c.token_ids) == 42 and c.finish_reason == "length"
    # Without ignore_eos it runs until eos or the context limit, never beyond.
    c = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=None), use_tqdm=False)[
        0
    ].outputs[0]
    assert len(c.token_ids) <= 42
    assert len(c.token_ids) == 42 or c.finish_reason == "stop"


def test_prompt_of_exactly_max_model_len_gets_one_token(llm):
    c = llm.generate(
        {"prompt_token_ids": random_prompt(2, 512)}, SamplingParams(temperature=0, max_tokens=None), use_tqdm=False
    )[0].outputs[0]
    assert len(c.token_ids) == 1


def test_skip_special_tokens(llm, ref):
    prompt = {"prompt_token_ids": ref["story_end"]}
    shown = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, skip_special_tokens=False), use_tqdm=False
    )[0].outputs[0]
    hidden = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)[
        0
    ].outputs[0]
    assert shown.token_ids == hidden.token_ids and shown.token_ids[0] == 1
    assert shown.text.startswith("<s>")
    assert "<s>" not in hidden.text and hidden.text.strip()
    assert shown.text.replace("<s>", "", 1) == hidden.text


def test_detokenize_false(llm, ref):
    c = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, detokenize=False), use_tqdm=False)[0].outputs[
        0
    ]
    assert c.text == ""
    assert c.token_ids == ref["once"]
