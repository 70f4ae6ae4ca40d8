"""LLM.generate and LLM.chat on the real stories260K model: every prompt form, input order,
default and per-prompt sampling params, metrics, and the chat template."""

from __future__ import annotations

import pytest
from api_helpers import EOS_IDS, GREEDY, PROMPT, random_prompt

from tram import SamplingParams

pytestmark = pytest.mark.usefixtures("no_request_left_behind")

# ----------------------------------------------------------------------------- input forms


def test_single_string_prompt(llm, ref):
    outs = llm.generate(PROMPT, GREEDY, use_tqdm=False)
    assert isinstance(outs, list) and len(outs) == 1
    out = outs[0]
    assert out.prompt == PROMPT
    assert out.prompt_token_ids == ref["tok"].encode(PROMPT) == [1, 403, 407, 261, 378]
    assert out.finished is True
    assert len(out.outputs) == 1 and out.outputs[0].index == 0
    assert out.outputs[0].token_ids == ref["once"]
    assert isinstance(out.request_id, str) and out.request_id


def test_all_prompt_forms_mixed_keep_input_order(llm, ref):
    tok = ref["tok"]
    tom_ids = tok.encode("Tom and his dog")
    prompts = [
        PROMPT,
        {"prompt": "Tom and his dog"},
        {"prompt_token_ids": tom_ids},
        {"prompt_token_ids": tok.encode(PROMPT), "prompt": "custom text"},
    ]
    # Different lengths so they finish out of input order.
    params = [SamplingParams(temperature=0, max_tokens=m) for m in (40, 3, 25, 1)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outs) == 4
    assert [o.prompt for o in outs] == [PROMPT, "Tom and his dog", None, "custom text"]
    assert [o.prompt_token_ids for o in outs] == [tok.encode(PROMPT), tom_ids, tom_ids, tok.encode(PROMPT)]
    assert [o.outputs[0].token_ids for o in outs] == [ref["once"], ref["tom"][:3], ref["tom"][:25], ref["once"][:1]]
    assert len({o.request_id for o in outs}) == 4
    for o in outs:
        assert o.finished and len(o.outputs) == 1 and o.outputs[0].index == 0
        assert o.outputs[0].finish_reason == "length"


def test_list_of_strings_with_one_params(llm, ref):
    outs = llm.generate(
        [PROMPT, "Tom and his dog", PROMPT], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )
    assert [o.prompt for o in outs] == [PROMPT, "Tom and his dog", PROMPT]
    assert [o.outputs[0].token_ids for o in outs] == [ref["once"][:12], ref["tom"][:12], ref["once"][:12]]


def test_default_sampling_params_give_16_tokens(llm):
    out = llm.generate({"prompt_token_ids": random_prompt(11, 8)}, use_tqdm=False)[0]
    c = out.outputs[0]
    assert len(c.token_ids) == 16 or (c.finish_reason == "stop" and c.token_ids[-1] in EOS_IDS)


def test_wrong_number_of_sampling_params(llm):
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate([PROMPT, "Tom and his dog"], [GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(PROMPT, [GREEDY, GREEDY], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_num_cached_tokens_and_metrics(llm):
    ids = random_prompt(1, 40)
    first = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    # Two full blocks of 16 are cached; the last prompt token is always recomputed.
    assert again.num_cached_tokens == 32
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    for out in (first, again):
        m = out.metrics
        assert m is not None
        assert m.first_token_time is not None and m.last_token_time is not None and m.finished_time is not None
        assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time
        assert m.num_generation_tokens == len(out.outputs[0].token_ids) == 40


# ---------------------------------------------------------------------------------- chat


def test_chat_single_conversation(llm, ref):
    conv = [{"role": "user", "content": PROMPT}]
    outs = llm.chat(conv, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    assert len(outs) == 1
    out = outs[0]
    assert out.prompt_token_ids[0] == 1 and out.prompt_token_ids[1] != 1
    assert out.prompt_token_ids.count(1) == 1
    assert out.prompt_token_ids == ref["tok"].encode(PROMPT)
    assert out.outputs[0].token_ids == ref["once"]
    assert out.finished and out.outputs[0].index == 0


def test_chat_list_of_conversations(llm, ref):
    tok = ref["tok"]
    convs = [
        [{"role": "user", "content": "Tom and his dog"}],
        [{"role": "system", "content": "Once upon"}, {"role": "user", "content": "a time"}],
        [{"role": "user", "content": PROMPT}],
    ]
    outs = llm.chat(convs, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert len(outs) == 3
    for out in outs:
        assert out.prompt_token_ids[0] == 1 and out.prompt_token_ids.count(1) == 1
        assert out.finished
    assert outs[0].outputs[0].token_ids == ref["tom"][:12]
    assert outs[2].outputs[0].token_ids == ref["once"][:12]
    assert tok.decode(outs[1].prompt_token_ids, skip_special_tokens=True) == "Once upon\na time"
    assert outs[1].prompt_token_ids != outs[2].prompt_token_ids
