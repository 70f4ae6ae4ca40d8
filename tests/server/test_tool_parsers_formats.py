"""The tool-call formats beyond hermes and llama3_json (mistral, pythonic, qwen3_coder, granite, gpt-oss's
harmony as `openai`), without a server: each canned output parsed whole, and streamed cut every way
(test_tool_parsers.check_case: one piece, one character at a time, random cuts) with the same content
and calls; malformed calls come back as content (base.py's rules)."""

from __future__ import annotations

import json

import pytest
from test_tool_parsers import NESTED_ARGS, WEATHER, Calls, check_case, chunkings, run_stream

from tram.config import ServerArgs
from tram.entrypoints.cli import build_parser
from tram.sampling_params import SamplingParams
from tram.server.tools.chat import ChatTool, apply_tool_plan, plan_tools
from tram.server.tools.parsers import get_tool_parser
from tram.server.tools.parsers.param_types import convert_param

NEW_PARSERS = ("mistral", "pythonic", "qwen3_coder", "granite", "openai")
Case = tuple[str, str | None, Calls | None]  # (output, content, calls); calls None: malformed, all content


def mistral_id(call_id: str) -> bool:
    return len(call_id) == 9 and call_id.isalnum() and call_id.isascii()


MISTRAL_CASES: list[Case] = [
    (f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}]', None, [("get_weather", WEATHER)]),
    (
        'Let me check. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}},\n {"name": "b", "arguments": {}}]',
        "Let me check. ",
        [("a", '{"x": 1}'), ("b", "{}")],
    ),
    (
        f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]now[ARGS]{{}}",
        None,
        [("get_weather", WEATHER), ("now", "{}")],
    ),
    (f"\n[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{NESTED_ARGS}", None, [("f", NESTED_ARGS)]),
    ('Sure.[TOOL_CALLS]f{"a": 1}', "Sure.", [("f", '{"a": 1}')]),  # a decoder that dropped [ARGS]
    ('[TOOL_CALLS][{"name": "f", "arguments": {}}]\nDone.', "\nDone.", [("f", "{}")]),
    ("No tools: [TOOL_CALL", "No tools: [TOOL_CALL", []),
    ("[TOOL_CALLS]", None, None),
    ("[TOOL_CALLS]get weather", None, None),
    ("[TOOL_CALLS]f[ARGS][1]", None, None),
    ('[TOOL_CALLS][{"name": "f", "arguments": "x"}]', None, None),
    ('[TOOL_CALLS]f[ARGS]{"a": }', None, None),
    ('Sure [TOOL_CALLS]f[ARGS]{"a": 1', None, None),
]

GRANITE_CASES: list[Case] = [
    (f'<|tool_call|>[{{"name": "get_weather", "arguments": {WEATHER}}}]', None, [("get_weather", WEATHER)]),
    (
        f'<tool_call> [{{"name": "a", "arguments": {{"x": 1}}}}, {{"arguments": {NESTED_ARGS}, "name": "b"}}]\n',
        None,
        [("a", '{"x": 1}'), ("b", NESTED_ARGS)],
    ),
    (' [{"name": "f", "arguments": {}}]', None, [("f", "{}")]),  # the marker was a skipped special token
    ("The weather is fine.", "The weather is fine.", []),
    ("<|tool_", "<|tool_", []),
    ('{"name": "f", "arguments": {}}', '{"name": "f", "arguments": {}}', []),  # no array: text
    ("<|tool_call|>[]", None, None),
    ("[not json]", None, None),
    ('[{"name": "f", "arguments": [1]}]', None, None),
]

PYTHONIC_CASES: list[Case] = [
    ('[get_weather(city="Paris", unit="celsius")]', None, [("get_weather", WEATHER)]),
    (
        "[f(a=(1, -2.5), b={'k': [True, None]}, s='''x)]\"y''', t=\"q\\\"(\", u='é☃'), now()]",
        None,
        [("f", '{"a": [1, -2.5], "b": {"k": [true, null]}, "s": "x)]\\"y", "t": "q\\"(", "u": "é☃"}'), ("now", "{}")],
    ),
    (' <|python_start|>[f(a="")]<|python_end|>\n', None, [("f", '{"a": ""}')]),
    ("The answer is 4.", "The answer is 4.", []),
    ("<|python_st", "<|python_st", []),
    ("[f(1)]", None, None),  # positional
    ("[f(a=g())]", None, None),  # not a literal
    ("[f(a=x)]", None, None),
    ("[f(a={1, 2})]", None, None),  # a set has no JSON form
    ("[f(a=1e999)]", None, None),
    ("[f(**k)]", None, None),
    ("[f(a=1, a=2)]", None, None),
    ("[os.system(cmd='ls')]", None, None),
    ("[1, 2]", None, None),
]

QWEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "temp": {"type": "number"},
                    "hot": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "tags": {"type": ["array", "null"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QWEN_CASES: list[Case] = [
    (qwen_call("get_weather", city="Paris"), None, [("get_weather", '{"city": "Paris"}')]),
    (
        "Let me check.\n\n" + qwen_call("get_weather", city="123", days="3", temp="20.0") + "\n" + qwen_call("now"),
        "Let me check.\n\n",
        [("get_weather", '{"city": "123", "days": 3, "temp": 20}'), ("now", "{}")],
    ),
    (
        qwen_call("get_weather", hot="True", opts='{"a": [1, "<b>"]}', tags="['x', 'y']", temp="-1.5", days="null"),
        None,
        [("get_weather", '{"hot": true, "opts": {"a": [1, "<b>"]}, "tags": ["x", "y"], "temp": -1.5, "days": null}')],
    ),
    (
        qwen_call("get_weather", city="two\nlines", days="many", other="7"),  # no int: text; undeclared: text
        None,
        [("get_weather", '{"city": "two\\nlines", "days": "many", "other": "7"}')],
    ),
    (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</function>",
        None,
        [("get_weather", '{"city": "Paris", "days": 2}')],
    ),
    (qwen_call("now") + "\nDone.", "\nDone.", [("now", "{}")]),
    ("Use <tool> or <tool_call", "Use <tool> or <tool_call", []),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n", None, None),  # cut off
    ("<tool_call>\nnot xml\n</tool_call>", None, None),
    ("<tool_call>\n<function=bad name>\n</function>\n</tool_call>", None, None),
    (
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
        None,
        None,
    ),
    ("<tool_call>\n<function=f>\njunk<parameter=a>\n1\n</parameter>\n</function>", None, None),
    ("<tool_call>\n<function=f>\n<parameter=>\n1\n</parameter>\n</function>", None, None),
]

ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|>"


def harmony_call(
    name: str, arguments: str, header: str = "<|channel|>commentary to=functions.{} <|constrain|>json"
) -> str:
    return "<|start|>assistant" + header.format(name) + "<|message|>" + arguments + "<|call|>"


OPENAI_CASES: list[Case] = [
    (ANALYSIS + harmony_call("get_weather", WEATHER), None, [("get_weather", WEATHER)]),
    (ANALYSIS + harmony_call("f", NESTED_ARGS)[: -len("<|call|>")], None, [("f", NESTED_ARGS)]),  # stopped at <|call|>
    (
        harmony_call("a", '{"x": 1}', " to=functions.{}<|channel|>commentary json") + harmony_call("b", "{}"),
        None,
        [("a", '{"x": 1}'), ("b", "{}")],
    ),
    (
        "<|channel|>commentary<|message|>Checking the weather.<|end|>" + harmony_call("get_weather", WEATHER),
        "Checking the weather.",
        [("get_weather", WEATHER)],
    ),
    (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>Hello there.<|return|>", "Hello there.", []),
    ("Plain answer, no harmony", "Plain answer, no harmony", []),
    ("<|chan", "<|chan", []),
    (harmony_call("f", "[1]"), None, None),
    (ANALYSIS + harmony_call("search", "{}", "<|channel|>commentary to=browser.{}"), None, None),
    (harmony_call("f", "hello", "<|channel|>commentary to=functions.{} <|constrain|>text"), None, None),
    (ANALYSIS + "<|start|>assistant<|channel|>commentary to=functions.f", None, None),  # cut in the header
    (ANALYSIS + '<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": 1', None, None),
    (ANALYSIS + "stray text" + harmony_call("f", "{}"), None, None),
]


@pytest.mark.parametrize("output,content,calls", MISTRAL_CASES)
def test_mistral(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("mistral", output, content, calls, mistral_id)


@pytest.mark.parametrize("output,content,calls", GRANITE_CASES)
def test_granite(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("granite", output, content, calls)


@pytest.mark.parametrize("output,content,calls", PYTHONIC_CASES)
def test_pythonic(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("pythonic", output, content, calls)


@pytest.mark.parametrize("output,content,calls", QWEN_CASES)
def test_qwen3_coder(output: str, content: str | None, calls: Calls | None) -> None:
    check_case(get_tool_parser("qwen3_coder").with_tools(QWEN_TOOLS), output, content, calls)


@pytest.mark.parametrize("output,content,calls", OPENAI_CASES)
def test_openai_harmony(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("openai", output, content, calls)


@pytest.mark.parametrize(
    "parser_name,output,streamed_calls,content",
    [
        ("mistral", "[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS][1]", [("a", "{}")], "[TOOL_CALLS]b[ARGS][1]"),
        ("pythonic", "[a(x=1)", [("a", '{"x": 1}')], ""),  # the list never closes
        ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}', [("a", "{}")], ""),  # the array never closes
        ("granite", '[{"name": "a", "arguments": {}}, oops]', [("a", "{}")], ", oops]"),
        ("granite", '<|tool_call|>[{"name": "a", "arguments": {}}', [("a", "{}")], ""),
        ("granite", '[{"name": "a", "arguments": {}}] and more', [("a", "{}")], "] and more"),
        ("pythonic", "[a(x=1)] and more", [("a", '{"x": 1}')], "] and more"),
        ("pythonic", "[a(), b(1)]", [("a", "{}"), ("b", "")], ", b(1)]"),
        (
            "qwen3_coder",
            qwen_call("a") + "\n<tool_call>\n<function=b>\n<parameter=x>\n1",
            [("a", "{}"), ("b", "{")],
            "\n<tool_call>\n<function=b>\n<parameter=x>\n1",
        ),
        (
            "openai",
            harmony_call("a", "{}") + harmony_call("b", "[1]"),
            [("a", "{}"), ("b", "")],
            harmony_call("b", "[1]"),
        ),
    ],
)
def test_malformed_after_a_call_streams_the_rest_as_content(
    parser_name: str, output: str, streamed_calls: Calls, content: str
) -> None:
    """Streamed, the calls already sent stand (a malformed one's name may have gone out); what the
    malformed one held back is content. Whole, the output is content."""
    parser = get_tool_parser(parser_name)
    whole = parser.extract_tool_calls(output)
    assert (whole.tools_called, whole.content) == (False, output)
    id_ok = mistral_id if parser_name == "mistral" else (lambda call_id: call_id.startswith("chatcmpl-tool-"))
    for pieces in chunkings(output):
        got_content, got_calls = run_stream(parser.stream(), pieces, id_ok)
        assert (got_content, [(n, a) for _, n, a in got_calls]) == (content, streamed_calls), pieces


def test_harmony_content_sent_before_a_malformed_call_stays_sent() -> None:
    """Harmony's markers are never content, so unlike the other formats the stream cannot send the
    whole output when a call after content is malformed: it sends the content, then the raw rest."""
    bad = harmony_call("f", "[1]")
    output = "<|channel|>commentary<|message|>Checking.<|end|>" + bad
    assert get_tool_parser("openai").extract_tool_calls(output).content == output
    for pieces in chunkings(output):
        assert run_stream(get_tool_parser("openai").stream(), pieces)[0] == "Checking.<|end|>" + bad, pieces


def test_openai_reads_what_the_gptoss_reasoning_parser_passes_on() -> None:
    from tram.server.reasoning import get_reasoning_parser

    _, answer = get_reasoning_parser("openai_gptoss").split(ANALYSIS + harmony_call("get_weather", WEATHER), True)
    assert answer is not None
    result = get_tool_parser("openai").extract_tool_calls(answer)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_weather", WEATHER)]


def test_mistral_ids_are_nine_alphanumerics_and_differ() -> None:
    output = "[TOOL_CALLS]" + json.dumps([{"name": f"f{i}", "arguments": {}} for i in range(20)])
    ids = [c.id for c in get_tool_parser("mistral").extract_tool_calls(output).tool_calls]
    assert len(ids) == 20 and all(mistral_id(i) for i in ids) and len(set(ids)) == 20


def test_qwen3_coder_without_tools_keeps_text() -> None:
    """No schema to say otherwise: every value stays the text the model wrote (null aside)."""
    output = qwen_call("get_weather", days="3", hot="true", opts="{}", none="null")
    calls = get_tool_parser("qwen3_coder").extract_tool_calls(output).tool_calls
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"days": "3", "hot": "true", "opts": "{}", "none": null}')
    ]


@pytest.mark.parametrize(
    "value,schema,expected",
    [
        ("7", {"type": "integer"}, 7),
        ("7.5", {"type": "integer"}, "7.5"),
        ("7.5", {"type": "number"}, 7.5),
        ("nan", {"type": "number"}, "nan"),
        ("FALSE", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, False),  # vLLM's reading: only "true" is true
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("{'a': (1,)}", {"type": "object"}, {"a": [1]}),
        ("{1, 2}", {"type": "object"}, "{1, 2}"),
        ("not json", {"type": "object"}, "not json"),
        ("NULL", {"type": "string"}, None),
        ("42", {"type": "string"}, "42"),
        ("42", {"enum": ["42"]}, "42"),
        ("42", {"type": "weird"}, 42),
    ],
)
def test_qwen3_coder_values_follow_the_schema(value: str, schema: dict, expected: object) -> None:
    assert convert_param(value, {"p": schema}, "p") == expected


def test_tool_plan_binds_the_requests_tools_and_keeps_special_tokens() -> None:
    """The chat request's tools reach qwen3_coder's parser; parsers whose markers are special tokens
    ask the request to keep them."""
    tools = [ChatTool.model_validate(t) for t in QWEN_TOOLS]
    plan = plan_tools(tools, "auto", get_tool_parser("qwen3_coder"), True)
    _, calls, finish = plan.finish(qwen_call("get_weather", days="2"), "stop")
    assert ([(c.name, c.arguments) for c in calls], finish) == ([("get_weather", '{"days": 2}')], "tool_calls")
    needs = {name: plan_tools(tools, "auto", get_tool_parser(name), True).needs_special_tokens for name in NEW_PARSERS}
    assert needs == {"mistral": True, "pythonic": False, "qwen3_coder": False, "granite": False, "openai": True}
    assert not plan_tools(tools, "required", get_tool_parser("mistral"), True).needs_special_tokens
    # Every endpoint (chat, Responses, Anthropic's Messages) applies a plan through apply_tool_plan.
    for name, keeps in needs.items():
        params = SamplingParams(max_tokens=4)
        apply_tool_plan(plan_tools(tools, "auto", get_tool_parser(name), True), None, params)
        assert params.skip_special_tokens is not keeps and params.structured_outputs is None


def test_serve_accepts_and_lists_the_new_parsers() -> None:
    for name in NEW_PARSERS:
        ServerArgs(tool_call_parser=name, enable_auto_tool_choice=True).validate()
    with pytest.raises(ValueError, match="granite, hermes, llama3_json, mistral, openai, pythonic, qwen3_coder"):
        ServerArgs(tool_call_parser="mistral_v3", enable_auto_tool_choice=True).validate()
    serve = build_parser(["serve"])._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = " ".join(serve.format_help().split())
    assert all(f"{name} (" in text for name in NEW_PARSERS)
