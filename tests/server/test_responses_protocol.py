"""The Responses API's request model and event stream without a server (milliseconds): which settings
count as "off" and are accepted, how `input` and `instructions` become chat messages, and how an
engine failure mid-stream becomes the API's `error` event. tests/server/test_responses_api.py runs
the endpoint end to end."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from tram.engine.async_llm import RequestFailedError
from tram.outputs import CompletionOutput, RequestOutput
from tram.sampling_params import SamplingParams
from tram.server.handlers.responses import ResponseBuilder, stream_events
from tram.server.protocol.responses import ResponsesRequest


@pytest.mark.parametrize(
    "off",
    [
        {"tools": []},
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"store": False},
        {"include": []},
        {"top_logprobs": 0},
        {"truncation": "disabled"},
        {"background": False},
        {"service_tier": "auto"},
        {"text": {"format": {"type": "text"}}},
        {"parallel_tool_calls": False},
    ],
)
def test_settings_that_mean_off_are_accepted(off):
    assert ResponsesRequest(input="hi", **off).unsupported() is None


@pytest.mark.parametrize(
    "on,field",
    [
        ({"top_logprobs": 1}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_tool_calls": 0}, "max_tool_calls"),
        ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_settings_that_mean_on_are_named(on, field):
    assert ResponsesRequest(input="hi", **on).unsupported()[0] == field


def test_input_becomes_chat_messages():
    req = ResponsesRequest(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "c", "annotations": []}],
            },
        ],
    )
    assert [(m.role, m.content) for m in req.messages()] == [
        ("system", "Be brief."),
        ("user", "a\nb"),
        ("assistant", "c"),
    ]
    assert [(m.role, m.content) for m in ResponsesRequest(input="hi").messages()] == [("user", "hi")]


@pytest.mark.parametrize(
    "body,words",
    [
        ({"input": ""}, ["empty"]),
        ({"input": []}, ["empty"]),
        ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, ["input[0].name", "Extra inputs"]),
        ({"input": ["x"]}, ["input[0]", "message object"]),
        ({"input": "x", "metadata": {"k" * 65: "v"}}, ["metadata"]),
    ],
)
def test_bad_input_is_a_validation_error(body, words):
    with pytest.raises(ValidationError) as e:
        ResponsesRequest(**body)
    assert all(w in str(e.value) for w in words), str(e.value)


class _FailingStream:
    """A request stream whose request fails in the engine after one output."""

    def __init__(self) -> None:
        self.outputs = 0
        self.closed = False

    def __aiter__(self) -> _FailingStream:
        return self

    async def __anext__(self) -> RequestOutput:
        self.outputs += 1
        if self.outputs > 1:
            raise RequestFailedError("the worker crashed")
        return RequestOutput("r", None, [1, 2], [CompletionOutput(0, "Once", [7], None, None)], False)

    async def aclose(self) -> None:
        self.closed = True


def test_stream_error_becomes_an_error_event():
    builder = ResponseBuilder(ResponsesRequest(input="hi"), SamplingParams(), "m")
    failing = _FailingStream()

    async def collect() -> list[str]:
        return [chunk async for chunk in stream_events(builder, failing)]  # type: ignore[arg-type]

    chunks = asyncio.run(collect())
    names = [c.split("\n", 1)[0] for c in chunks]
    assert names == [
        "event: response.created",
        "event: response.in_progress",
        "event: response.output_item.added",
        "event: response.content_part.added",
        "event: response.output_text.delta",
        "event: error",
    ]
    data = json.loads(chunks[-1].split("data: ", 1)[1])
    assert data == {
        "type": "error",
        "sequence_number": 5,
        "code": "500",
        "param": None,
        "message": "The engine failed this request: the worker crashed",
    }
    assert failing.closed, "the stream must be closed (its request aborted) after an error"
