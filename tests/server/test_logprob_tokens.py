"""Logprob tokens add up to the text on the server, as in OpenAI and vLLM: completions' `tokens`
concatenate to the choice's text (echoed prompt included) and `text_offset` indexes that text, in
one response and across streamed chunks; chat's `token`s concatenate to the content and their
`bytes` to the content's UTF-8, byte-fallback pieces included (`tram.engine.logprob_text`).
The server and its fixtures are test_server_openai's (one server for this module)."""

from __future__ import annotations

from collections import defaultdict

import httpx
import openai
from conftest import STORIES
from server_utils import RemoteServer
from test_server_openai import client, no_kv_in_use, server, tokenize  # noqa: F401 (fixtures)

PROMPTS = ["Once upon a time, there was a little girl", "Tom saw a → and 🙂"]  # the second: byte fallback
ARROW_LEAD = 3 + 0xE2  # stories260K's <0xE2>: the first byte of "→", a token of its own


def assert_indexes(text: str, lp: dict) -> None:
    """tokens concatenate to the text and each text_offset points at its token."""
    assert "".join(lp["tokens"]) == text
    for offset, token in zip(lp["text_offset"], lp["tokens"], strict=True):
        assert text[offset : offset + len(token)] == token


def completion(server: RemoteServer, body: dict) -> dict:
    r = httpx.post(server.url + "/v1/completions", json={"model": STORIES, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(client: openai.OpenAI, **kw) -> tuple[dict, dict]:
    """Per choice index, the assembled text and the concatenated logprobs of a streamed completion."""
    text: dict[int, str] = defaultdict(str)
    lps: dict[int, dict] = defaultdict(lambda: {"tokens": [], "text_offset": [], "token_logprobs": []})
    for chunk in client.completions.create(model=STORIES, stream=True, **kw):
        for c in chunk.choices:
            text[c.index] += c.text
            if c.logprobs is not None:
                for key in lps[c.index]:
                    lps[c.index][key] += getattr(c.logprobs, key)
    return dict(text), dict(lps)


def test_completion_tokens_keep_their_spaces(server):
    body = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "logprobs": 3}
    (choice,) = completion(server, body)["choices"]
    lp = choice["logprobs"]
    assert_indexes(choice["text"], lp)
    assert lp["tokens"][:2] == [" named", " Lily"]  # the defect's case: no token lost its space
    # The chosen token is among its top logprobs under the same text (greedy: the most likely).
    assert all(top[tok] == max(top.values()) for tok, top in zip(lp["tokens"], lp["top_logprobs"]))


def test_echo_tokens_add_up_to_prompt_and_output(server, client):
    body = {"prompt": PROMPTS, "max_tokens": 10, "n": 2, "temperature": 1.0, "seed": 7, "echo": True, "logprobs": 2}
    full = completion(server, body)["choices"]
    assert [c["index"] for c in full] == [0, 1, 2, 3]
    for c in full:
        prompt = PROMPTS[c["index"] // 2]
        assert c["text"].startswith(prompt)
        assert_indexes(c["text"], c["logprobs"])
        n_prompt = len(tokenize(server, prompt=prompt))
        # The first token (BOS) has no logprob and shows nothing; the prompt's add up to it.
        assert c["logprobs"]["tokens"][0] == "" and c["logprobs"]["token_logprobs"][0] is None
        assert "".join(c["logprobs"]["tokens"][:n_prompt]) == prompt
    arrow = full[2]["logprobs"]["tokens"]
    assert "→" in arrow and "\ufffd" not in "".join(arrow)
    text, lps = streamed(client, **{k: v for k, v in body.items()})
    for c in full:
        i = c["index"]
        assert text[i] == c["text"] and lps[i]["tokens"] == c["logprobs"]["tokens"]
        assert lps[i]["text_offset"] == c["logprobs"]["text_offset"]


def test_streamed_offsets_index_the_text_when_text_is_held_back(client):
    # A long stop string that never matches holds back the text's end in every chunk, while the
    # tokens go out at once: offsets must follow the tokens, not the text sent so far.
    for echo in (False, True):
        kw = {
            "prompt": [PROMPTS[0], "Tom and his dog"],
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": 1,
            "echo": echo,
            "stop": ["never in a story like this"],
        }
        text, lps = streamed(client, **kw)
        full = client.completions.create(model=STORIES, **kw).choices
        for c in full:
            assert text[c.index] == c.text
            assert_indexes(c.text, lps[c.index])
            assert lps[c.index]["text_offset"] == c.logprobs.text_offset


def test_token_id_prompt_echo_and_a_completed_character(server):
    ids = tokenize(server, prompt="Once upon a time")
    (echo,) = completion(server, {"prompt": ids, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 0})[
        "choices"
    ]
    assert_indexes(echo["text"], echo["logprobs"])  # the echoed text of ids shows the BOS: '<s> ...'
    # A prompt ending inside "→" (E2 86); the output's first byte (92) completes the character.
    ids = tokenize(server, prompt="Tom saw a") + [3 + 0xE2, 3 + 0x86]
    (c,) = completion(
        server, {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 2, "logit_bias": {str(3 + 0x92): 100}}
    )["choices"]
    assert c["text"] == "→" and c["logprobs"]["tokens"] == ["→"] and c["logprobs"]["text_offset"] == [0]


def test_chat_tokens_and_bytes_add_up_to_the_content(client):
    messages = [{"role": "user", "content": "Tom saw a → and 🙂"}]
    got = client.chat.completions.create(
        model=STORIES, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3
    ).choices[0]
    content = got.logprobs.content
    assert "".join(e.token for e in content) == got.message.content
    assert sum((e.bytes for e in content), []) == list(got.message.content.encode("utf-8"))
    assert all(e.bytes for e in content) and all(t.bytes for e in content for t in e.top_logprobs if t.token)
    assert any(e.token.startswith(" ") for e in content)
    stream = client.chat.completions.create(
        model=STORIES, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    chunks = [e for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert [(e.token, e.bytes) for e in chunks] == [(e.token, e.bytes) for e in content]


def test_chat_partial_character_bytes(client):
    # Forced lead bytes of "→" that never complete: no text, and each token still has its byte.
    got = client.chat.completions.create(
        model=STORIES,
        messages=[{"role": "user", "content": "Tom saw a"}],
        max_tokens=2,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
        logit_bias={str(ARROW_LEAD): 100},
    ).choices[0]
    assert got.message.content == ""
    assert [(e.token, e.bytes) for e in got.logprobs.content] == [("", [0xE2]), ("", [0xE2])]
