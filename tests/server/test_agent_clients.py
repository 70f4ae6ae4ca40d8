"""Agent frameworks against a real `tram serve`, unchanged, as their users run them:

- the OpenAI Agents SDK runs a two-tool agent loop to its final answer, on the Responses API and on
  chat completions, whole and streamed: a first turn that must call `look_up`, its result sent back,
  a second turn that must call `answer`, whose result ends the run;
- LangChain's `ChatOpenAI.bind_tools` with a forced tool choice (on chat, and on the Responses API
  with `use_responses_api`), and `with_structured_output` both ways (json_schema, function calling);
- older clients' deprecated `functions` / `function_call` on chat, read as tools and tool_choice.

stories260K has no judgement to test: tool_choice forces every call, and the tools' arguments are
enums, so what is checked is the protocol round trip (schemas sent, calls parsed by the client with
arguments valid for them, results carried back, the loop ending). The session's shared
default-flags server serves the module (its compact JSON lets the tiny model end its calls)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunContextWrapper,
    Runner,
    StopAtTools,
    function_tool,
    set_tracing_disabled,
)
from conftest import STORIES
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel
from server_utils import RemoteServer, shared_openai_fixtures

server, client, no_kv_in_use = shared_openai_fixtures()  # the session's default-flags server


set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers


@dataclass
class Notebook:
    """The run's context: the calls the tools received, in order."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def looked_up(ctx: RunContextWrapper[Notebook], _agent: Any) -> bool:
    return any(name == "look_up" for name, _ in ctx.context.calls)


@function_tool(is_enabled=lambda ctx, agent: not looked_up(ctx, agent))
def look_up(ctx: RunContextWrapper[Notebook], city: Literal["Paris", "Rome"]) -> str:
    """Look up the weather in a city."""
    ctx.context.calls.append(("look_up", {"city": city}))
    return f"It is sunny in {city}."


@function_tool(is_enabled=looked_up)
def answer(ctx: RunContextWrapper[Notebook], weather: Literal["sunny", "rainy"]) -> str:
    """Give the final answer."""
    ctx.context.calls.append(("answer", {"weather": weather}))
    return f"The weather is {weather}."


def weather_agent(model: Any) -> Agent[Notebook]:
    """Each turn offers one tool and must call it (tool_choice "required", one call): look_up while
    nothing is looked up, then answer, whose result is the final output."""
    return Agent[Notebook](
        name="weather",
        instructions="Answer questions about the weather.",
        model=model,
        tools=[look_up, answer],
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200),
        reset_tool_choice=False,
        tool_use_behavior=StopAtTools(stop_at_tool_names=["answer"]),
    )


async def run_agent(server: RemoteServer, api: str, stream: bool) -> tuple[Any, Notebook]:
    async with AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60) as api:
        model_type = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = weather_agent(model_type(model=STORIES, openai_client=api))
        notebook = Notebook()
        kwargs = {"context": notebook, "max_turns": 4}
        if not stream:
            return await Runner.run(agent, "What is the weather in Paris?", **kwargs), notebook
        result = Runner.run_streamed(agent, "What is the weather in Paris?", **kwargs)
        async for _ in result.stream_events():
            pass
        return result, notebook


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_two_tool_loop(server: RemoteServer, api: str, stream: bool) -> None:
    result, notebook = asyncio.run(run_agent(server, api, stream))
    # Both tools ran, in order, with arguments the SDK validated against their schemas.
    assert [name for name, _ in notebook.calls] == ["look_up", "answer"], notebook.calls
    assert notebook.calls[0][1]["city"] in ("Paris", "Rome") and notebook.calls[1][1]["weather"] in ("sunny", "rainy")
    assert result.final_output == f"The weather is {notebook.calls[1][1]['weather']}."
    assert len(result.raw_responses) == 2  # two model turns, the second after the first's result
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "tool_call_item", "tool_call_output_item"], kinds
    first_call, first_output = result.new_items[0].raw_item, result.new_items[1].raw_item
    call_id = first_call["call_id"] if isinstance(first_call, dict) else first_call.call_id
    assert first_output["call_id"] == call_id  # the result answered the server's call


class Weather(BaseModel):
    """The weather in a city."""

    city: Literal["Paris", "Rome"]
    unit: Literal["c", "f"]


def chat_model(server: RemoteServer, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.url + "/v1", api_key="x", model=STORIES, temperature=0, max_tokens=200, max_retries=0, **kwargs
    )


@pytest.mark.parametrize("use_responses_api", [False, True], ids=["chat", "responses"])
def test_langchain_bind_tools_forced(server: RemoteServer, use_responses_api: bool) -> None:
    llm = chat_model(server, use_responses_api=use_responses_api).bind_tools([Weather], tool_choice="Weather")
    message = llm.invoke("What is the weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "Weather" and call["id"] and call["type"] == "tool_call"
    Weather.model_validate(call["args"])
    assert not message.invalid_tool_calls


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(server: RemoteServer, method: str) -> None:
    llm = chat_model(server).with_structured_output(Weather, method=method, include_raw=True)
    out = llm.invoke("What is the weather in Paris?")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Weather), out
    raw = out["raw"]
    if method == "function_calling":  # a forced call of the schema's tool
        (call,) = raw.tool_calls
        assert call["name"] == "Weather" and Weather.model_validate(call["args"]) == out["parsed"]
    else:
        assert Weather.model_validate_json(raw.content) == out["parsed"]


# ---- older clients: chat's deprecated functions / function_call ---------------------------------

CLOCK = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
FUNCTIONS = [{"name": "get_time", "description": "The time in a zone.", "parameters": CLOCK}]
QUESTION = [{"role": "user", "content": "What time is it?"}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_legacy_function_call_forces_the_call(client, stream: bool) -> None:
    """`functions` are the tools and `function_call: {"name"}` forces one; the answer is chat's
    current shape (tool_calls), the same call as the same request in today's fields."""
    kwargs = {"model": STORIES, "messages": QUESTION, "temperature": 0, "max_tokens": 100}
    legacy = client.chat.completions.create(functions=FUNCTIONS, function_call={"name": "get_time"}, **kwargs)
    tools = [{"type": "function", "function": f} for f in FUNCTIONS]
    named = {"type": "function", "function": {"name": "get_time"}}
    current = client.chat.completions.create(tools=tools, tool_choice=named, **kwargs)
    (choice,), (expected,) = legacy.choices, current.choices
    assert choice.finish_reason == expected.finish_reason == "tool_calls"
    (call,), (expected_call,) = choice.message.tool_calls, expected.message.tool_calls
    assert call.function == expected_call.function and call.function.name == "get_time"
    if stream:
        chunks = client.chat.completions.create(
            functions=FUNCTIONS, function_call={"name": "get_time"}, stream=True, **kwargs
        )
        arguments = "".join(
            d.function.arguments or "" for chunk in chunks for d in chunk.choices[0].delta.tool_calls or []
        )
        assert arguments == call.function.arguments
    # "none": the functions are offered (to the template) and text comes back.
    text = client.chat.completions.create(functions=FUNCTIONS, function_call="none", **{**kwargs, "max_tokens": 5})
    assert text.choices[0].message.content and not text.choices[0].message.tool_calls


LEGACY_ERRORS = [
    ({"functions": FUNCTIONS, "tools": [{"type": "function", "function": FUNCTIONS[0]}]}, "functions"),
    ({"functions": FUNCTIONS, "function_call": "required"}, "function_call"),
    ({"functions": FUNCTIONS, "function_call": {"name": "get_time"}, "tool_choice": "none"}, "function_call"),
    ({"functions": [{"name": "get time"}]}, "functions.0.name"),
    ({"functions": {"name": "get_time"}}, "functions"),
    ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "tool_choice"),
]


@pytest.mark.parametrize("extra,param", LEGACY_ERRORS, ids=[str(i) for i in range(len(LEGACY_ERRORS))])
def test_legacy_function_errors_are_400s(client, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=STORIES, messages=QUESTION, max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body
