"""`tram serve --structured-outputs-backend guidance` (llguidance) end to end through the `openai`
SDK: a JSON schema and a regex hold, streamed as whole, and a regex llguidance refuses is a 400
naming its field, streamed too. The fuller tour runs on xgrammar in test_structured_outputs_api.py;
this module checks that the other engine is wired the same way. No KV block may be left in use."""

from __future__ import annotations

import re

import openai
import pytest
from conftest import STORIES
from server_pool import ServerSpec
from server_utils import openai_module_fixtures
from structured_cases import (
    MESSAGES,
    PERSON,
    PROMPT,
    REGEX,
    SEEDED,
    SHOPPING,
    chat,
    json_schema_format,
    json_schema_round,
    stream_completion,
    valid,
)

SERVER = ServerSpec(
    STORIES, ("--structured-outputs-backend", "guidance", "--structured-outputs-disable-any-whitespace")
)
SERVERS = (SERVER,)  # started a module ahead (server_pool.py)
server, client, no_kv_in_use = openai_module_fixtures(SERVER)


@pytest.mark.parametrize("schema", [PERSON, SHOPPING], ids=["person", "shopping"])
def test_json_schema(client, schema: dict) -> None:
    # The whole text, up to its closing brace (llguidance stopped a token before xgrammar does).
    json_schema_round(client, schema, **SEEDED)
    for c in chat(client, n=2, response_format=json_schema_format(schema), max_tokens=100, **SEEDED).choices:
        assert c.finish_reason == "stop", c
        valid(c.message.content, schema)


def test_regex(client) -> None:
    for seed in (1, 2, 3):
        kw = {
            "prompt": PROMPT,
            "max_tokens": 20,
            "temperature": 0.8,
            "seed": seed,
            "extra_body": {"guided_regex": REGEX},
        }
        out = client.completions.create(model=STORIES, **kw).choices[0]
        assert re.fullmatch(REGEX, out.text) and out.finish_reason == "stop", out
        assert stream_completion(client, **kw) == (out.text, "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_invalid_regex_is_400(client, stream: bool) -> None:
    for field, value in (("guided_regex", "[a-"), ("structured_outputs", {"regex": "(ab"})):
        with pytest.raises(openai.BadRequestError) as info:  # at create(): before any stream event
            client.completions.create(
                model=STORIES, prompt=PROMPT, max_tokens=5, stream=stream, extra_body={field: value}
            )
        assert info.value.param == field, info.value.body
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=STORIES, messages=MESSAGES, max_tokens=5, stream=stream, extra_body={field: value}
            )
        assert info.value.param == field, info.value.body
    assert client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
