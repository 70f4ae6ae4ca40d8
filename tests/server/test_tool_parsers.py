"""Tool parsers on canned model outputs: each output parsed whole, and streamed cut every way
(one piece, one character at a time, random cuts) with the streamed deltas checked against the
whole-output parse (base.py's rules). Forced tool choices: the schema, and reading outputs back."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from itertools import zip_longest

import jsonschema
import pytest

from tram.server.tools.parsers import TOOL_PARSERS, get_tool_parser
from tram.server.tools.parsers.base import ToolCallStream, ToolParser, collect_deltas
from tram.server.tools.parsers.forced import ForcedToolStream, forced_tool_schema, parse_forced_tool_calls
from tram.server.tools.parsers.json_scan import ValueScanner

Calls = list[tuple[str, str]]  # (name, arguments)

NESTED_ARGS = (
    r'{"q": {"a": [1, {"b": "}{]["}], "s": "say \"hi\" \\ {"}, '
    r'"u": "héllo ☃ 😀 \u00e9", "n": null}'
)
NOT_A_CALL = "Use the <tool> element, or <tool_calls>, or <tool_ca"
WEATHER = '{"city": "Paris", "unit": "celsius"}'


def hermes_call(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# (output, content, calls). calls None: the first call is malformed, so the whole output is content
# and no call is made, streamed (content-wise: a name may have gone out) as well as whole.
HERMES_CASES: list[tuple[str, str | None, Calls | None]] = [
    (hermes_call(f'{{"name": "get_weather", "arguments": {WEATHER}}}'), None, [("get_weather", WEATHER)]),
    (
        hermes_call('{"name": "a", "arguments": {"x": 1}}') + "\n" + hermes_call('{"name": "b", "arguments": {}}'),
        None,
        [("a", '{"x": 1}'), ("b", "{}")],
    ),
    (
        "Let me look that up.\n\n" + hermes_call(f'{{"name": "get_weather", "arguments": {WEATHER}}}'),
        "Let me look that up.\n\n",
        [("get_weather", WEATHER)],
    ),
    ("\n\n" + hermes_call(f'{{"name": "f", "arguments": {NESTED_ARGS}}}') + "\n", None, [("f", NESTED_ARGS)]),
    (hermes_call('{"arguments": {"x": [1, 2]}, "name": "late_name"}'), None, [("late_name", '{"x": [1, 2]}')]),
    (hermes_call('{"name": "no_args"}'), None, [("no_args", "{}")]),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a": 1}')]),  # no </tool_call>
    ('<tool_call>{"name": "f", "arguments": {}}\nDone.', "\nDone.", [("f", "{}")]),
    (hermes_call('{"name": "f", "arguments": {}}') + "\n\nAnything else?", "\n\nAnything else?", [("f", "{}")]),
    ('{"name": "f", "arguments": {}}</tool_call>', '{"name": "f", "arguments": {}}</tool_call>', []),
    (NOT_A_CALL, NOT_A_CALL, []),
    ("  \n", None, []),
    (hermes_call('{"name": "f", "arguments": {"a": 1,}}'), None, None),  # invalid JSON inside the arguments
    (hermes_call('{"name": "f" "arguments": {}}'), None, None),  # invalid JSON between members
    (hermes_call('{"arguments": {"a": 1}}'), None, None),  # no name
    (hermes_call('{"name": "", "arguments": {}}'), None, None),
    (hermes_call('{"name": 7, "arguments": {}}'), None, None),
    (hermes_call('{"name": "f", "arguments": "{\\"a\\": 1}"}'), None, None),  # arguments not an object
    (hermes_call('{"name": "f", "arguments": {}, "arguments": {}}'), None, None),
    (hermes_call('{"name": "f", "arguments": {"x": NaN}}'), None, None),
    ('Sure. <tool_call>\n{"name": "f", "arguments": {"a": "unterminated', None, None),
    ("<tool_call>not json</tool_call> then text", None, None),
]

LLAMA_CASES: list[tuple[str, str | None, Calls | None]] = [
    (f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}', None, [("get_weather", WEATHER)]),
    (f' \n<|python_tag|> {{"name": "f", "parameters": {NESTED_ARGS}}}\n', None, [("f", NESTED_ARGS)]),
    (
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": [1, 2]}};',
        None,
        [("a", '{"x": 1}'), ("b", '{"y": [1, 2]}')],
    ),
    (
        '{"name": "a", "arguments": {"x": "semi;colon"}}\n;\n{"name": "b"}',
        None,
        [("a", '{"x": "semi;colon"}'), ("b", "{}")],
    ),
    ("The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("  Maybe {like this}", "  Maybe {like this}", []),
    ("<|python_tag|>print('hi')", "<|python_tag|>print('hi')", []),
    ("<|python_ta", "<|python_ta", []),
    ('{"name": "a", "parameters": {"x": 1}', None, None),  # unterminated
    ('{"name": "a", "parameters": [1]}', None, None),
    ('{"name": "a", "parameters": {"x": tru}}', None, None),
    ('{"name": "a", "parameters": {}, "arguments": {}}', None, None),
    ('{"parameters": {}}', None, None),
]


def chunkings(text: str) -> list[list[str]]:
    """One piece, one character at a time, and random cuts (some pieces empty)."""
    rng = random.Random(text)  # a str seed is hashed the same way on every run
    ways = [[text], list(text)]
    for _ in range(4):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12))))
        ways.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return ways


def default_id(call_id: str) -> bool:
    return call_id.startswith("chatcmpl-tool-")


def run_stream(
    stream: ToolCallStream, pieces: list[str], id_ok: Callable[[str], bool] = default_id
) -> tuple[str, list[tuple[str, str, str]]]:
    """Feed the pieces, checking the delta protocol; the content and (id, name, arguments) per call."""
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for delta in [stream.feed(p) for p in pieces] + [stream.finish()]:
        if delta is None:
            continue
        assert delta.content or delta.tool_calls, "an empty delta should be None"
        content.append(delta.content or "")
        for d in delta.tool_calls:
            if d.index not in calls:
                assert d.id and id_ok(d.id) and d.name, d
                calls[d.index] = [d.id, d.name, ""]
            else:
                assert d.id is None and d.name is None, "id and name go out once, in a call's first delta"
            calls[d.index][2] += d.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    assert len({c[0] for c in calls.values()}) == len(calls), "one id per call"
    return "".join(content), [(c[0], c[1], c[2]) for c in (calls[k] for k in sorted(calls))]


def check_case(
    parser_name: str | ToolParser,
    output: str,
    content: str | None,
    calls: Calls | None,
    id_ok: Callable[[str], bool] = default_id,
) -> None:
    parser = get_tool_parser(parser_name) if isinstance(parser_name, str) else parser_name
    whole = parser.extract_tool_calls(output)
    if calls is None:
        assert (whole.tools_called, whole.tool_calls, whole.content) == (False, [], output)
    else:
        assert (whole.tools_called, whole.content) == (bool(calls), content)
        assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
        assert all(isinstance(json.loads(c.arguments), dict) for c in whole.tool_calls)
    for pieces in chunkings(output):
        streamed_content, streamed_calls = run_stream(parser.stream(), pieces, id_ok)
        assert streamed_content == (whole.content or ""), pieces
        if calls is not None:  # a malformed call may have sent its name and part of its arguments
            assert [(n, a) for _, n, a in streamed_calls] == calls, pieces


@pytest.mark.parametrize("output,content,calls", HERMES_CASES)
def test_hermes(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("hermes", output, content, calls)


@pytest.mark.parametrize("output,content,calls", LLAMA_CASES)
def test_llama3_json(output: str, content: str | None, calls: Calls | None) -> None:
    check_case("llama3_json", output, content, calls)


@pytest.mark.parametrize(
    "parser_name,output,calls,content",
    [
        (
            "hermes",
            hermes_call('{"name": "a", "arguments": {}}') + "\n" + hermes_call("{bad}"),
            [("a", "{}")],
            "\n" + hermes_call("{bad}"),
        ),
        ("llama3_json", '{"name": "a", "parameters": {}}; oops', [("a", "{}")], "; oops"),
        (
            "llama3_json",
            '{"name": "a", "parameters": {}};\n{"parameters": 1, "name": "b"} and on',
            [("a", "{}")],
            ';\n{"parameters": 1, "name": "b"} and on',
        ),
    ],
)
def test_malformed_after_a_call_streams_the_rest_as_content(
    parser_name: str, output: str, calls: Calls, content: str
) -> None:
    """Streamed, the calls already sent stand; what the malformed one held back is content."""
    parser = get_tool_parser(parser_name)
    assert not parser.extract_tool_calls(output).tools_called
    for pieces in chunkings(output):
        streamed_content, streamed_calls = run_stream(parser.stream(), pieces)
        assert (streamed_content, [(n, a) for _, n, a in streamed_calls]) == (content, calls)


def test_name_goes_out_before_the_object_closes() -> None:
    stream = get_tool_parser("hermes").stream()
    assert stream.feed("Hi <tool_") is not None  # "Hi " is content; "<tool_" is held back
    first = stream.feed('call>{"name": "get_weather", "argu')
    assert first is not None and first.content is None and first.tool_calls[0].name == "get_weather"
    args = stream.feed('ments": {"city": "Par')
    assert args is not None and args.tool_calls[0].arguments == '{"city": "Par'
    assert stream.feed('is"}}').tool_calls[0].arguments == 'is"}'  # type: ignore[union-attr]
    assert stream.feed("\n</tool_call>") is None and stream.finish() is None


def test_one_parser_serves_interleaved_streams() -> None:
    parser = get_tool_parser("hermes")
    outputs = [
        hermes_call('{"name": "a", "arguments": {"x": 1}}'),
        "text " + hermes_call('{"name": "b", "arguments": {}}'),
    ]
    streams = [parser.stream(), parser.stream()]
    deltas: list[list] = [[], []]
    for pieces in zip_longest(*(list(o) for o in outputs), fillvalue=""):
        for i, piece in enumerate(pieces):
            deltas[i].append(streams[i].feed(piece))
    results = [collect_deltas(d + [s.finish()]) for d, s in zip(deltas, streams)]
    assert [(content, [(c.name, c.arguments) for c in calls]) for content, calls in results] == [
        ("", [("a", '{"x": 1}')]),
        ("text ", [("b", "{}")]),
    ]


def test_get_tool_parser() -> None:
    assert set(TOOL_PARSERS) == {"granite", "hermes", "llama3_json", "mistral", "openai", "pythonic", "qwen3_coder"}
    with pytest.raises(ValueError, match="granite, hermes, llama3_json, mistral, openai, pythonic, qwen3_coder"):
        get_tool_parser("mistral_v2")


@pytest.mark.parametrize(
    "text,end",
    [
        ('"a\\"b" rest', 6),
        ('{"a": "}", "b": [1, {"c": "\\\\"}]} x', 33),
        ("[[], {}]", 8),
        ("123, 4", 3),
        ("true}", 4),
        ('{"open": "str', None),
        ('"esc\\', None),
    ],
)
def test_value_scanner_finds_the_end_in_any_pieces(text: str, end: int | None) -> None:
    for pieces in chunkings(text):
        scanner, offset, found = ValueScanner(), 0, None
        for piece in pieces:
            at = scanner.scan(piece)
            if at is not None:
                found = offset + at
                break
            offset += len(piece)
        assert found == end, pieces


# Forced tool choices

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY, "strict": True},
    },
    {"type": "function", "function": {"name": "now"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_forced_schemas_are_json_schema_and_accept_valid_outputs() -> None:
    required = forced_tool_schema(TOOLS, "required")
    named = forced_tool_schema(TOOLS, NAMED)
    assert named == TOOLS[0]["function"]["parameters"]
    assert forced_tool_schema(TOOLS, {"type": "function", "function": {"name": "now"}}) == {
        "type": "object",
        "properties": {},
    }
    assert required is not None and named is not None
    for schema in (required, named):
        jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(
        [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "now", "parameters": {}}], required
    )
    jsonschema.validate({"city": "Paris"}, named)
    for wrong in (
        [],
        [{"name": "other", "parameters": {}}],
        [{"name": "now", "parameters": {}, "x": 1}],
        [{"name": "get_weather", "parameters": {}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, required)


def test_forced_schema_refusals() -> None:
    assert forced_tool_schema(TOOLS, "auto") is None and forced_tool_schema(TOOLS, "none") is None
    with pytest.raises(ValueError, match="'missing'"):
        forced_tool_schema(TOOLS, {"type": "function", "function": {"name": "missing"}})
    with pytest.raises(ValueError, match="at least one tool"):
        forced_tool_schema([], "required")
    with pytest.raises(ValueError):
        forced_tool_schema([{"type": "function"}], "required")


@pytest.mark.parametrize(
    "choice,output,calls",
    [
        (NAMED, ' {"city": "Paris \\"{"}\n', [("get_weather", '{"city": "Paris \\"{"}')]),
        (
            "required",
            '[{"name": "get_weather", "parameters": {"city": "Paris"}},\n {"name": "now", "parameters": {}}]',
            [("get_weather", '{"city": "Paris"}'), ("now", "{}")],
        ),
        ("required", f' [ {{"parameters": {NESTED_ARGS}, "name": "f"}} ] ', [("f", NESTED_ARGS)]),
    ],
)
def test_forced_outputs_parse_and_stream_alike(choice: str | dict, output: str, calls: Calls) -> None:
    parsed = parse_forced_tool_calls(output, choice)
    assert [(c.name, c.arguments) for c in parsed] == calls
    for pieces in chunkings(output):
        content, streamed = run_stream(ForcedToolStream(choice), pieces)
        assert content == "" and [(n, a) for _, n, a in streamed] == calls, pieces


def test_forced_named_stream_sends_id_and_name_first() -> None:
    delta = ForcedToolStream(NAMED).feed("")
    assert delta is not None and delta.tool_calls[0].name == "get_weather" and delta.tool_calls[0].id


@pytest.mark.parametrize(
    "choice,output",
    [
        (NAMED, '{"city": "Par'),
        (NAMED, "[1]"),
        (NAMED, ""),
        ("required", "[]"),
        ("required", '[{"name": "now", "parameters": {}}'),
        ("required", '{"name": "now", "parameters": {}} {"name": "now", "parameters": {}}'),
        ("required", '[{"name": "now", "parameters": {}}] extra'),
        ("required", '[{"name": 1, "parameters": {}}]'),
    ],
)
def test_forced_malformed_outputs_are_refused(choice: str | dict, output: str) -> None:
    with pytest.raises(ValueError):
        parse_forced_tool_calls(output, choice)
    content, _ = run_stream(ForcedToolStream(choice), list(output))
    assert content == ""


def test_forced_stream_refuses_a_choice_that_forces_nothing() -> None:
    with pytest.raises(ValueError):
        ForcedToolStream("auto")


def test_tool_parsers_import_without_torch() -> None:
    code = "import sys, tram.server.tools.parsers, tram.server.tools.parsers.forced; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
