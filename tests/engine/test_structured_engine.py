"""Structured outputs through the offline API on stories260K, a story model that cannot write JSON:
only the grammar makes these outputs valid. Batching, preemption, chunked prefill, prefix caching
and n > 1 must keep every constrained output valid and leave unconstrained ones unchanged."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from api_helpers import PROMPT, assert_no_leak

from tram import LLM, SamplingParams, StructuredOutputsParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "sleepy"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "age", "mood", "tags"],
    "additionalProperties": False,
}
CAT = {
    "type": "object",
    "properties": {"legs": {"type": "integer", "minimum": 0, "maximum": 4}, "color": {"enum": ["black", "white"]}},
    "required": ["legs", "color"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{2,6} (ran|sat|hid) [0-9]{1,3} times\."
GRAMMAR = 'root ::= "Tom " verb " the " noun "."\nverb ::= "saw" | "ate"\nnoun ::= "cake" | "dog" | "sun"'


def constrained(
    max_tokens: int = 80, temperature: float = 0.0, seed: int | None = None, n: int = 1, **constraint
) -> SamplingParams:
    so = StructuredOutputsParams(**constraint, disable_any_whitespace=True)
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, n=n, structured_outputs=so)


def check(kind: str, spec, text: str) -> None:
    if kind == "json":
        jsonschema.validate(json.loads(text), spec)
    elif kind == "regex":
        assert re.fullmatch(spec, text), text
    elif kind == "choice":
        assert text in spec
    elif kind == "grammar":
        assert re.fullmatch(r"Tom (saw|ate) the (cake|dog|sun)\.", text), text
    else:
        assert isinstance(json.loads(text), dict)


CASES = [
    ("json", PERSON),
    ("json", CAT),
    ("regex", REGEX),
    ("choice", ["a red fox", "the moon", "Tom"]),
    ("grammar", GRAMMAR),
]


def test_every_kind_of_constraint_holds_greedy_and_sampled(llm: LLM) -> None:
    params = [constrained(**{kind: spec}) for kind, spec in CASES]
    params += [constrained(temperature=1.0, seed=7 + i, **{kind: spec}) for i, (kind, spec) in enumerate(CASES)]
    outs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    for (kind, spec), out in zip(CASES + CASES, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (kind, c.text)
        check(kind, spec, c.text)


def test_structural_tag(llm: LLM) -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "Pet: "},
                {"type": "json_schema", "json_schema": {"enum": ["cat", "dog"]}},
            ],
        },
    }
    out = llm.generate([PROMPT], constrained(structural_tag=json.dumps(tag)), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r'Pet: "(cat|dog)"', out.text) and out.finish_reason == "stop"


def test_json_object(llm: LLM) -> None:
    params = SamplingParams(
        max_tokens=60,
        temperature=0,
        structured_outputs=StructuredOutputsParams(json_object=True, disable_any_whitespace=True),
    )
    # Greedy, this model opens a key and writes a story into it; the object closes only if the story
    # ends, so the check is on what is there: a prefix the JSON grammar allows.
    text = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].text
    assert text.startswith("{")


def test_unconstrained_outputs_do_not_change_beside_constrained_ones(llm: LLM) -> None:
    plain = [
        SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0.9, seed=3, ignore_eos=True),
    ]
    prompts = [PROMPT, "Tom and his dog"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, plain, use_tqdm=False)]
    mixed_params = [constrained(json=PERSON), plain[0], constrained(regex=REGEX), plain[1], constrained(json=CAT)]
    mixed_prompts = [PROMPT, prompts[0], "Lily", prompts[1], "The sun"]
    outs = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    assert [outs[1].outputs[0].token_ids, outs[3].outputs[0].token_ids] == alone
    check("json", PERSON, outs[0].outputs[0].text)
    check("regex", REGEX, outs[2].outputs[0].text)


def test_n_samples_each_follow_the_grammar(llm: LLM) -> None:
    out = llm.generate([PROMPT], constrained(temperature=1.0, seed=11, n=3, json=PERSON), use_tqdm=False)[0]
    assert len(out.outputs) == 3
    for c in out.outputs:
        check("json", PERSON, c.text)


def test_prefix_cache_hits_and_chunked_prefill_keep_outputs() -> None:
    """A long prompt prefilled in 16-token chunks, and the same prompt again from the prefix cache,
    give the constrained output of a plain run."""
    from conftest import STORIES

    prompt = " ".join(["Once upon a time there was a little dog named Max."] * 12)
    params = constrained(json=PERSON)
    ref = LLM(STORIES, max_num_seqs=4).generate([prompt], params, use_tqdm=False)[0].outputs[0].text
    chunked = LLM(STORIES, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=True)
    first, second = (chunked.generate([prompt], params, use_tqdm=False)[0] for _ in range(2))
    assert first.outputs[0].text == second.outputs[0].text == ref
    assert second.num_cached_tokens > 0
    check("json", PERSON, ref)
    assert_no_leak(chunked.llm_engine)


def test_preemption_keeps_the_grammar_state(small: LLM) -> None:
    """Two long constrained requests in a cache that holds one context must preempt each other; the
    matchers survive the recompute and the outputs equal the unpreempted ones."""
    schema = {"type": "array", "items": {"enum": ["cat", "dog", "sun"]}, "minItems": 40, "maxItems": 40}
    params = [
        constrained(max_tokens=400, json=schema),
        constrained(max_tokens=400, temperature=1.0, seed=5, json=schema),
    ]
    prompt = " ".join(["Once upon a time there was a little dog."] * 20)
    before = small.llm_engine.engine_core.scheduler.num_preemptions
    outs = small.generate([prompt, prompt + " Then"], params, use_tqdm=False)
    assert small.llm_engine.engine_core.scheduler.num_preemptions > before
    alone = [small.generate([p], q, use_tqdm=False)[0] for p, q in zip([prompt, prompt + " Then"], params)]
    for out, ref in zip(outs, alone):
        assert out.outputs[0].finish_reason == "stop"
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        check("json", schema, out.outputs[0].text)


@pytest.mark.parametrize(
    "constraint, param",
    [
        ({"regex": "(ab"}, "structured_outputs"),
        ({"json": {"type": "bogus"}}, "structured_outputs"),
        ({"grammar": 'root ::= "a" |'}, "structured_outputs"),
        ({"json": '{"type": "object"', "source_field": "guided_json"}, "guided_json"),
    ],
)
def test_a_bad_constraint_is_a_value_error_naming_the_field(llm: LLM, constraint: dict, param: str) -> None:
    with pytest.raises(ValueError) as info:
        llm.generate([PROMPT], SamplingParams(structured_outputs=StructuredOutputsParams(**constraint)), use_tqdm=False)
    assert getattr(info.value, "param", None) == param
    # The engine goes on serving.
    assert llm.generate([PROMPT], constrained(regex=REGEX), use_tqdm=False)[0].outputs[0].finish_reason == "stop"


def test_exactly_one_constraint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()


def test_compiled_grammars_are_cached(llm: LLM) -> None:
    stats = llm.llm_engine.engine_core.structured_output.stats
    unique = {
        "type": "object",
        "properties": {"x": {"enum": ["cache-test"]}},
        "required": ["x"],
        "additionalProperties": False,
    }
    hits, requests = stats.cache_hits, stats.requests
    llm.generate([PROMPT] * 3, constrained(json=unique), use_tqdm=False)
    assert (stats.requests - requests, stats.cache_hits - hits) == (3, 2)


def nested_one_of(depth: int) -> dict:
    if depth == 0:
        return {"type": "string"}
    inner = nested_one_of(depth - 1)
    return {"oneOf": [{"type": "object", "properties": {"a": inner, "b": inner}}, {"type": "array", "items": inner}]}


def test_a_grammar_that_compiles_too_long_fails_alone() -> None:
    import time

    from conftest import STORIES

    # Depth 8 compiles in ~14 s on a 2-core VM, and the regex after it in ~0.06 s: a second's deadline
    # leaves both a wide margin on a loaded machine (0.5 s with depth 7, ~2 s, failed the regex there).
    llm = LLM(STORIES, max_num_seqs=4, structured_outputs_compile_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(ValueError, match="took too long"):
        llm.generate(
            [PROMPT], SamplingParams(structured_outputs=StructuredOutputsParams(json=nested_one_of(8))), use_tqdm=False
        )
    assert time.monotonic() - start < 4.0  # at the deadline, long before the compile would end
    assert llm.generate([PROMPT], constrained(regex=REGEX), use_tqdm=False)[0].outputs[0].finish_reason == "stop"
    assert_no_leak(llm.llm_engine)


def test_llguidance_backend() -> None:
    from conftest import STORIES

    llm = LLM(STORIES, max_num_seqs=4, structured_outputs_backend="guidance")
    outs = llm.generate(
        [PROMPT] * 3,
        [constrained(json=PERSON), constrained(regex=REGEX), constrained(choice=["yes", "no"])],
        use_tqdm=False,
    )
    check("json", PERSON, outs[0].outputs[0].text)
    check("regex", REGEX, outs[1].outputs[0].text)
    check("choice", ["yes", "no"], outs[2].outputs[0].text)
    with pytest.raises(ValueError, match="regex"):
        llm.generate([PROMPT], constrained(regex="(ab"), use_tqdm=False)
    assert_no_leak(llm.llm_engine)


def test_whitespace_pattern_and_additional_properties(llm: LLM) -> None:
    """llguidance takes a whitespace pattern and closes objects on request; xgrammar refuses the
    pattern (a 400 naming the field, not a silently ignored option)."""
    from conftest import STORIES

    from tram.structured_output.guidance_backend import no_additional_properties

    open_schema = {"type": "object", "properties": {"a": {"enum": ["x", {"k": 1}]}}, "required": ["a"]}
    closed = no_additional_properties(open_schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["enum"][1] == {"k": 1}
    guidance = LLM(STORIES, max_num_seqs=4, structured_outputs_backend="guidance")
    so = StructuredOutputsParams(json=open_schema, whitespace_pattern=r"[ ]?", disable_additional_properties=True)
    text = (
        guidance.generate(
            [PROMPT], SamplingParams(max_tokens=40, temperature=0, structured_outputs=so), use_tqdm=False
        )[0]
        .outputs[0]
        .text
    )
    assert set(json.loads(text)) == {"a"} and "\n" not in text
    assert_no_leak(guidance.llm_engine)
    refused = SamplingParams(structured_outputs=StructuredOutputsParams(json=open_schema, whitespace_pattern=" "))
    with pytest.raises(ValueError, match="whitespace_pattern needs"):
        llm.generate([PROMPT], refused, use_tqdm=False)
