"""The reasoning parsers without a server: what each makes of whole outputs, and the same streamed in
every way of cutting them; when a request's output begins with thinking; the model check that
refuses a parser whose markers the vocabulary lacks; and what a plan does to the sampling params."""

from __future__ import annotations

import random

import pytest
from conftest import STORIES

from tram.config import ServerArgs
from tram.config.registry import REASONING_PARSERS
from tram.sampling_params import SamplingParams, StructuredOutputsParams
from tram.server.reasoning import get_reasoning_parser
from tram.server.reasoning.base import ReasoningParser, join_deltas
from tram.server.reasoning.plan import ReasoningPlan, ReasoningSetup

THINK_CASES = [
    # (output, (reasoning, content)) for deepseek_r1 and qwen3 alike
    ("Let me see.</think>\n\nIt is 4.", ("Let me see.", "\n\nIt is 4.")),
    ("<think>Let me see.</think>It is 4.", ("Let me see.", "It is 4.")),
    ("\n<think>\nhm</think>", ("\nhm", None)),
    ("</think>Just the answer", (None, "Just the answer")),
    ("Still thinking when cut off", ("Still thinking when cut off", None)),
    ("cut inside the end tag </thi", ("cut inside the end tag </thi", None)),
    ("<thi", ("<thi", None)),
    ("a < b, so </think> a <think> in the answer </think>", ("a < b, so ", " a <think> in the answer </think>")),
    ("", (None, None)),
]
HARMONY = "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
CALL = "<|start|>assistant<|channel|>commentary to=functions.pet <|constrain|>json<|message|>{}<|call|>"
GPTOSS_CASES = [
    (HARMONY, ("User says hi.", "Hello!")),
    (HARMONY + "<|return|>", ("User says hi.", "Hello!")),
    ("<|channel|>analysis<|message|>a<|end|>" + CALL, ("a", CALL)),
    ("<|channel|>analysis<|message|>cut off <|en", ("cut off <|en", None)),
    ("<|channel|>final<|message|>Hi <b>", (None, "Hi <b>")),
    ("No harmony at all", (None, "No harmony at all")),
    ("<|channel|>analy", (None, "<|channel|>analy")),
]


def _streamed(parser: ReasoningParser, pieces: list[str], thinking: bool = True) -> tuple[str | None, str | None]:
    stream = parser.stream(thinking)
    reasoning, content = join_deltas([*(stream.feed(p) for p in pieces), stream.finish()])
    return reasoning or None, content or None


def _cuts(text: str, rng: random.Random) -> list[list[str]]:
    """Every single cut, one piece per character, and random cuts."""
    ways = [[text[:k], text[k:]] for k in range(len(text) + 1)] + [list(text)]
    for _ in range(20):
        points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
        ways.append([text[a:b] for a, b in zip([0, *points], [*points, len(text)])])
    return ways


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize(("output", "expected"), THINK_CASES)
def test_think_tags_whole_and_streamed_in_every_cut(name: str, output: str, expected: tuple) -> None:
    parser = get_reasoning_parser(name)
    assert parser.split(output) == expected
    for pieces in _cuts(output, random.Random(output)):
        assert _streamed(parser, pieces) == expected, pieces


@pytest.mark.parametrize(("output", "expected"), GPTOSS_CASES)
def test_gptoss_channels_whole_and_streamed_in_every_cut(output: str, expected: tuple) -> None:
    parser = get_reasoning_parser("openai_gptoss")
    assert parser.split(output) == expected
    for pieces in _cuts(output, random.Random(output)):
        assert _streamed(parser, pieces) == expected, pieces


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3", "openai_gptoss"])
def test_an_output_that_does_not_think_is_all_content(name: str) -> None:
    parser = get_reasoning_parser(name)
    text = "<think>not thinking</think> answer"
    assert parser.split(text, thinking=False) == (None, text)
    assert _streamed(parser, list(text), thinking=False) == (None, text)


def test_when_the_output_begins_with_thinking() -> None:
    qwen3, r1, gptoss = (get_reasoning_parser(n) for n in ("qwen3", "deepseek_r1", "openai_gptoss"))
    assert qwen3.thinks("<|im_start|>assistant\n", None)
    assert qwen3.thinks("<|im_start|>assistant\n<think>\n", {"enable_thinking": True})
    # Qwen3's template closes the thinking in the prompt when it is switched off...
    assert not qwen3.thinks("<|im_start|>assistant\n<think>\n\n</think>\n\n", None)
    # ...and the switch alone says so for a template that writes nothing.
    assert not qwen3.thinks("<|im_start|>assistant\n", {"enable_thinking": False})
    assert r1.thinks("<｜Assistant｜><think>\n", {"enable_thinking": False})  # R1 has no switch
    # An earlier turn's closed thinking does not close this one's.
    assert r1.thinks("<think>a</think>b<｜end▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n", None)
    assert gptoss.thinks("<|start|>assistant", None)
    assert not gptoss.thinks("<|start|>assistant<|channel|>final<|message|>", None)


def test_names_are_vllms_and_an_unknown_one_is_refused() -> None:
    assert {"deepseek_r1", "qwen3", "openai_gptoss"} <= set(REASONING_PARSERS)
    with pytest.raises(ValueError, match=r"--reasoning-parser nope is not supported: choose one of .*qwen3"):
        ServerArgs(reasoning_parser="nope").validate()
    assert "deepseek_r1" in REASONING_PARSERS.help_text()


def test_a_model_without_the_markers_is_refused_naming_them() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(STORIES)  # a story model: no <think> token
    with pytest.raises(ValueError, match=r"--reasoning-parser qwen3: .*no <think>, </think> token"):
        ReasoningSetup.load("qwen3", tokenizer)
    with pytest.raises(ValueError, match=r"--reasoning-parser openai_gptoss: .*<\|channel\|>"):
        ReasoningSetup.load("openai_gptoss", tokenizer)


def test_the_plan_defers_the_constraint_and_keeps_special_markers() -> None:
    qwen3 = ReasoningSetup(get_reasoning_parser("qwen3"), [7])
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))
    ReasoningPlan(qwen3, thinking=True).apply(params)
    assert params.structured_outputs is not None and params.structured_outputs.reasoning_end == [7]
    assert params.skip_special_tokens
    closed = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))
    ReasoningPlan(qwen3, thinking=False).apply(closed)  # no thinking: the grammar applies at once
    assert closed.structured_outputs is not None and closed.structured_outputs.reasoning_end is None
    harmony = SamplingParams()
    ReasoningPlan(ReasoningSetup(get_reasoning_parser("openai_gptoss"), [1, 2, 3]), thinking=True).apply(harmony)
    assert not harmony.skip_special_tokens and harmony.structured_outputs is None


def test_include_reasoning_false_drops_only_the_thinking() -> None:
    setup = ReasoningSetup(get_reasoning_parser("deepseek_r1"), [7])
    assert ReasoningPlan(setup, thinking=True, include=False).split("a</think>b") == (None, "b")
    assert ReasoningPlan().split("a</think>b") == (None, "a</think>b")  # no parser: all content


def test_the_end_tokens_come_from_the_vocabulary() -> None:
    from transformers import AddedToken, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|start|>", "<|channel|>", "<|message|>", "<|end|>"]})
    vocab = tokenizer.get_vocab()
    assert ReasoningSetup.load("qwen3", tokenizer).end_token_ids == [vocab["</think>"]]
    ids = ReasoningSetup.load("openai_gptoss", tokenizer).end_token_ids  # a sequence: channel, "final", message
    assert ids[0] == vocab["<|channel|>"] and ids[-1] == vocab["<|message|>"] and len(ids) > 2
    assert tokenizer.decode(ids).replace(" ", "") == "<|channel|>final<|message|>"


@pytest.mark.parametrize(
    ("pieces", "status", "kinds"),
    [
        (["Once</thi", "nk>Hi", " there"], "completed", ["reasoning", "message"]),
        (["still thinking wh", "en cut off"], "incomplete", ["reasoning"]),
        (["</think>", "Hi"], "completed", ["message"]),
    ],
)
def test_responses_items_streamed_match_the_whole(pieces: list[str], status: str, kinds: list[str]) -> None:
    from tram.server.handlers.responses_items import ItemStream, output_items
    from tram.server.reasoning.responses import ReasoningItems, whole_items

    plan = ReasoningPlan(ReasoningSetup(get_reasoning_parser("deepseek_r1"), [7]), thinking=True)
    events: list[tuple[str, dict]] = []

    def emit(kind: str, **fields: object) -> str:
        events.append((kind, fields))
        return kind

    items = ReasoningItems(emit, plan, ItemStream(emit, None, "msg_1"), "rs_1")
    for chunk in (*items.begin(), *(e for p in pieces for e in items.feed(p)), *items.end(status)):
        assert isinstance(chunk, str)
    thoughts, answer = whole_items(plan, "".join(pieces), status, "rs_1")
    whole = thoughts + (output_items(answer, [], status, "msg_1") if answer or not thoughts else [])
    assert [i["type"] for i in items.items] == kinds and items.items == whole
    added = [f["output_index"] for k, f in events if k == "response.output_item.added"]
    assert added == list(range(len(kinds)))  # each item opens after the one before is done
