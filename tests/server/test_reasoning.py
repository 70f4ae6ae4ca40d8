"""Reasoning end to end: `tram serve --reasoning-parser qwen3` on a tiny model that thinks
(tests/thinking_model.py: after the prompt's `<think>` it writes "Once upon time", `</think>`,
then "Lily was happy"). The thinking comes back as `reasoning_content`, the answer as `content`,
whole and streamed; include_reasoning false drops it; enable_thinking false (chat_template_kwargs)
makes the template close the thinking, so all is content; a JSON schema and a forced tool call
apply only after `</think>` (the thinking's words are not JSON: a grammar applied from the start
would have refused them), and tool_choice "auto" finds calls in the answer alone."""

from __future__ import annotations

import json
from typing import Any

import openai
from server_utils import DEFAULT_SERVER_ENV, openai_module_fixtures
from thinking_model import ANSWER, REASONING, ThinkingModelSpec, words

MESSAGES = [{"role": "user", "content": "Tell me a story"}]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "pet",
            "parameters": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]},
        },
    }
]
ARGS = ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
SERVER = ThinkingModelSpec(args=ARGS, env=tuple(DEFAULT_SERVER_ENV.items()))
SERVERS = (SERVER,)  # started (and its model built) a module ahead: server_pool.py


server, client, no_kv_in_use = openai_module_fixtures(SERVER)


def ask(client: openai.OpenAI, **kwargs: Any):
    return client.chat.completions.create(model=SERVER.model, messages=MESSAGES, **kwargs)


def reasoning_of(obj: Any) -> str | None:
    extra = obj.model_extra or {}
    assert extra.get("reasoning") == extra.get("reasoning_content")  # vLLM's new name, the same text
    return extra.get("reasoning_content")


def test_the_thinking_is_reasoning_content_and_the_answer_content(client: openai.OpenAI) -> None:
    choice = ask(client, max_tokens=20, temperature=1.0, seed=3).choices[0]
    assert reasoning_of(choice.message).split() == words(REASONING)
    assert choice.message.content.split() == words(ANSWER)
    assert choice.finish_reason == "stop"


def test_streamed_deltas_add_up_to_the_same_split(client: openai.OpenAI) -> None:
    whole = ask(client, max_tokens=20).choices[0].message
    reasoning, content, finish = "", "", None
    for chunk in ask(client, max_tokens=20, stream=True):
        delta = chunk.choices[0].delta
        reasoning += reasoning_of(delta) or ""
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content) == (reasoning_of(whole), whole.content)
    assert finish == "stop"


def test_include_reasoning_false_drops_the_thinking(client: openai.OpenAI) -> None:
    message = ask(client, max_tokens=20, extra_body={"include_reasoning": False}).choices[0].message
    assert reasoning_of(message) is None
    assert message.content.split() == words(ANSWER)
    streamed = "".join(
        (c.choices[0].delta.content or "") + (reasoning_of(c.choices[0].delta) or "")
        for c in ask(client, max_tokens=20, stream=True, extra_body={"include_reasoning": False})
    )
    assert streamed.split() == words(ANSWER)


def test_enable_thinking_false_makes_all_of_it_content(client: openai.OpenAI) -> None:
    body = {"chat_template_kwargs": {"enable_thinking": False}}
    message = ask(client, max_tokens=20, extra_body=body).choices[0].message
    assert reasoning_of(message) is None
    assert message.content.split() == words(ANSWER)


def test_a_json_schema_applies_only_after_the_thinking(client: openai.OpenAI) -> None:
    body = {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}
    choice = ask(client, max_tokens=40, extra_body=body).choices[0]
    assert reasoning_of(choice.message).split() == words(REASONING)
    assert set(json.loads(choice.message.content)) == {"ok"}
    assert choice.finish_reason == "stop"


def test_a_forced_tool_call_comes_after_the_thinking(client: openai.OpenAI) -> None:
    choice = ask(client, max_tokens=60, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "pet"}})
    choice = choice.choices[0]
    assert reasoning_of(choice.message).split() == words(REASONING)
    [call] = choice.message.tool_calls
    assert call.function.name == "pet" and json.loads(call.function.arguments)["kind"] in ("cat", "dog")
    assert choice.finish_reason == "tool_calls"


def test_auto_tool_calls_are_read_from_the_answer(client: openai.OpenAI) -> None:
    call = '<tool_call>{"name": "pet", "arguments": {"kind": "cat"}}</tool_call>'
    body = {"structured_outputs": {"grammar": "root ::= " + json.dumps(call)}}  # applied after </think>
    for stream in (False, True):
        if stream:
            reasoning, calls = "", {}
            for chunk in ask(client, max_tokens=60, tools=TOOLS, stream=True, extra_body=body):
                delta = chunk.choices[0].delta
                reasoning += reasoning_of(delta) or ""
                for d in delta.tool_calls or []:
                    calls[d.index] = calls.get(d.index, "") + (d.function.arguments or "")
                assert not delta.content
            arguments = list(calls.values())
        else:
            message = ask(client, max_tokens=60, tools=TOOLS, extra_body=body).choices[0].message
            reasoning, arguments = reasoning_of(message), [c.function.arguments for c in message.tool_calls]
            assert message.content is None
        assert reasoning.split() == words(REASONING)
        assert [json.loads(a) for a in arguments] == [{"kind": "cat"}]


def test_responses_return_a_reasoning_item_before_the_answer(client: openai.OpenAI) -> None:
    response = client.responses.create(model=SERVER.model, input="Tell me a story", max_output_tokens=20)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    thought, message = response.output
    assert [part.type for part in thought.content] == ["reasoning_text"]
    assert thought.content[0].text.split() == words(REASONING)
    assert response.output_text.split() == words(ANSWER)
    assert response.status == "completed"


def test_responses_stream_the_reasoning_item_then_the_answer(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(model=SERVER.model, input="Tell me a story", max_output_tokens=20, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning.split() == words(REASONING)
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == reasoning
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1]
