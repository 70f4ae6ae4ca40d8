"""RequestOutputKind end to end on stories260K: the DELTA outputs of a request, concatenated, equal
its last CUMULATIVE output and its one FINAL_ONLY output (text, token ids, logprobs, cumulative
logprob, finish and stop reasons, prompt logprobs), whatever stopped it and however many samples."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from api_helpers import PROMPT, drain
from conftest import assert_no_leak

from tram import LLM, SamplingParams
from tram.outputs import CompletionOutput, RequestOutput
from tram.sampling_params import RequestOutputKind

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
_ids = itertools.count()


@pytest.fixture(scope="module")
def chunky(stories_path: str) -> LLM:
    """A 16-token step budget: a 40-token prompt is prefilled in three chunks, each of which
    delivers part of its prompt logprobs."""
    return LLM(stories_path, max_num_seqs=8, max_num_batched_tokens=16, enable_prefix_caching=False)


def run(llm: LLM, prompt, params: SamplingParams, kind: RequestOutputKind) -> list[RequestOutput]:
    engine = llm.llm_engine
    rid = f"kind-{next(_ids)}"
    engine.add_request(rid, prompt, msgspec.structs.replace(params, output_kind=kind))
    outs = drain(engine)[rid]
    assert_no_leak(engine)
    return outs


def joined(deltas: list[RequestOutput]) -> dict[int, CompletionOutput]:
    """The completions that the deltas add up to, per sample index."""
    total: dict[int, CompletionOutput] = {}
    for out in deltas:
        for c in out.outputs:
            t = total.setdefault(c.index, CompletionOutput(c.index, "", [], None, None))
            t.text += c.text
            t.token_ids += c.token_ids
            if c.logprobs is not None:
                t.logprobs = (t.logprobs or []) + c.logprobs
            t.cumulative_logprob, t.finish_reason, t.stop_reason = c.cumulative_logprob, c.finish_reason, c.stop_reason
    return total


def assert_kinds_agree(llm: LLM, prompt, params: SamplingParams) -> list[RequestOutput]:
    cumulative = run(llm, prompt, params, CUMULATIVE)
    deltas = run(llm, prompt, params, DELTA)
    final = run(llm, prompt, params, FINAL_ONLY)
    want = cumulative[-1]
    assert len(final) == 1 and final[0].finished and final[0].outputs == want.outputs
    assert final[0].prompt_logprobs == want.prompt_logprobs
    assert [o.finished for o in deltas] == [False] * (len(deltas) - 1) + [True]
    assert sorted(joined(deltas).values(), key=lambda c: c.index) == want.outputs
    # Prompt logprobs come once, complete, with the first output.
    with_prompt_lps = [o.prompt_logprobs for o in deltas if o.prompt_logprobs is not None]
    if want.prompt_logprobs is None:
        assert not with_prompt_lps
    else:
        assert deltas[0].prompt_logprobs == want.prompt_logprobs and len(with_prompt_lps) == 1
        assert len(want.prompt_logprobs) == len(want.prompt_token_ids)
    return deltas


@pytest.mark.parametrize(
    "stop,include",
    [
        (["girl named"], False),  # the match starts inside the held-back text of earlier tokens
        (["zzz", "Lil"], True),  # the match ends inside " Lily", and is kept
        (["Lil"], False),
        (["qqqq"], False),  # never matches: runs to length with text held back until the end
    ],
)
def test_delta_adds_up_to_cumulative_with_stop_strings(llm, stop, include):
    params = SamplingParams(temperature=0, max_tokens=40, stop=stop, include_stop_str_in_output=include, logprobs=3)
    deltas = assert_kinds_agree(llm, PROMPT, params)
    # One new token per step, and never a token twice.
    assert all(len(c.token_ids) == 1 for o in deltas for c in o.outputs)


def test_delta_text_is_held_back_while_a_stop_string_may_be_forming(llm):
    deltas = run(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, stop=["x" * 30]), DELTA)
    # With a 30-character stop string, nothing can be streamed before 29 characters are known.
    assert deltas[0].outputs[0].text == "" and deltas[-1].outputs[0].text


def test_n_samples(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=30, logprobs=2, stop=[" the"])
    deltas = assert_kinds_agree(llm, "Tom and his dog", params)
    assert set(joined(deltas)) == {0, 1, 2}


def test_prompt_logprobs_under_chunked_prefill(chunky):
    prompt = {"prompt_token_ids": [1] + [403, 304, 260, 261, 378, 259, 268, 270] * 5}
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=2, prompt_logprobs=3)
    cumulative = run(chunky, prompt, params, CUMULATIVE)
    # Cumulative outputs show the prompt logprobs as they arrive, chunk by chunk, before any token.
    assert not cumulative[0].outputs[0].token_ids and len(cumulative[0].prompt_logprobs) < 41
    assert_kinds_agree(chunky, prompt, params)
    assert_kinds_agree(chunky, prompt, msgspec.structs.replace(params, n=2, temperature=1.0, seed=3))


def test_llm_generate_asks_for_final_only_without_touching_the_callers_params(llm):
    params = SamplingParams(temperature=0, max_tokens=5)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert out.finished and len(out.outputs[0].token_ids) == 5
    assert params.output_kind == CUMULATIVE


def test_output_kind_is_validated_and_survives_the_wire():
    params = SamplingParams(output_kind=1)
    assert params.output_kind is DELTA
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams).output_kind is DELTA
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams(output_kind=0))) == {}  # omitted
    for bad in (3, True, "delta"):
        with pytest.raises(ValueError, match="output_kind"):
            SamplingParams(output_kind=bad)
