"""`tram serve` end to end through the official `openai` SDK (and httpx where the SDK cannot go):
streamed == non-streamed, greedy == the offline `LLM`, n>1, logprobs, stops, token-id prompts,
length controls, the utility endpoints, metrics, the legacy /generate, and client disconnects.
One real server serves the whole module; every test must leave no KV block in use."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import openai
import pytest
import torch
from conftest import STORIES
from prometheus_client.parser import text_string_to_metric_families
from server_utils import RemoteServer, settled_kv, shared_server

from tram import LLM, SamplingParams

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]
SEEDED = {"temperature": 1.0, "seed": 1234}
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer):
    # The session's default-flags server (one engine thread: server_utils.DEFAULT_SERVER_ENV).
    yield from shared_server(stories_server)
    state = settled_kv(stories_server)
    assert state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0, state
    assert state["kv_cache_usage"] == 0 and state["num_unfinished_in_frontend"] == 0, state


@pytest.fixture(autouse=True)
def no_kv_in_use(server: RemoteServer):
    yield
    state = settled_kv(server)
    assert state["blocks"]["in_use"] == 0 and state["num_running_reqs"] == 0, state
    assert state["num_unfinished_in_frontend"] == 0, state


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def llm():
    # One thread here too (as the server's engine); restored for the modules that run after this one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield LLM(model=str(STORIES))
    finally:
        torch.set_num_threads(threads)


def tokenize(server: RemoteServer, **body) -> list[int]:
    r = httpx.post(server.url + "/tokenize", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def stream_completion(client: openai.OpenAI, **kw) -> dict:
    """Assemble a streamed completion per choice index; usage chunks are kept apart."""
    out: dict = {
        "text": defaultdict(str),
        "finish": {},
        "stop_reason": {},
        "lp": defaultdict(list),
        "offsets": defaultdict(list),
        "usage": [],
    }
    for chunk in client.completions.create(model=STORIES, stream=True, **kw):
        if not chunk.choices:
            out["usage"].append(chunk.usage)
            continue
        assert not out["usage"], "the usage chunk must be the last one"
        for c in chunk.choices:
            assert c.index not in out["finish"], f"choice {c.index} got a chunk after finishing"
            if c.logprobs is not None and c.logprobs.text_offset:
                # Offsets point into the assembled text: a chunk starts where the text so far ends.
                out["offsets"][c.index].append((c.logprobs.text_offset[0], len(out["text"][c.index])))
                out["lp"][c.index] += c.logprobs.token_logprobs
            out["text"][c.index] += c.text
            if c.finish_reason is not None:
                out["finish"][c.index], out["stop_reason"][c.index] = c.finish_reason, c.stop_reason
    return out


def stream_chat(client: openai.OpenAI, **kw) -> dict:
    out: dict = {
        "text": defaultdict(str),
        "finish": {},
        "roles": defaultdict(list),
        "lp": defaultdict(list),
        "usage": [],
    }
    for chunk in client.chat.completions.create(model=STORIES, messages=MESSAGES, stream=True, **kw):
        if not chunk.choices:
            out["usage"].append(chunk.usage)
            continue
        assert not out["usage"], "the usage chunk must be the last one"
        for c in chunk.choices:
            out["roles"][c.index].append(c.delta.role)
            out["text"][c.index] += c.delta.content or ""
            if c.logprobs is not None:
                out["lp"][c.index] += [e.logprob for e in c.logprobs.content]
            if c.finish_reason is not None:
                out["finish"][c.index] = c.finish_reason
    return out


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_completion_stream_equals_non_stream(server, client, sampling):
    full = client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=20, **sampling)
    s = stream_completion(client, prompt=PROMPT, max_tokens=20, stream_options={"include_usage": True}, **sampling)
    (choice,) = full.choices
    assert dict(s["text"]) == {0: choice.text} and s["finish"] == {0: choice.finish_reason}
    (usage,) = s["usage"]
    num_prompt = len(tokenize(server, prompt=PROMPT))
    assert usage.prompt_tokens == full.usage.prompt_tokens == num_prompt
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_chat_stream_equals_non_stream(server, client, sampling):
    full = client.chat.completions.create(model=STORIES, messages=MESSAGES, max_tokens=20, **sampling)
    s = stream_chat(client, max_tokens=20, stream_options={"include_usage": True}, **sampling)
    (choice,) = full.choices
    assert choice.message.role == "assistant"
    assert dict(s["text"]) == {0: choice.message.content} and s["finish"] == {0: choice.finish_reason}
    roles = s["roles"][0]
    assert len(roles) > 1 and roles[0] == "assistant" and not any(roles[1:]), roles
    (usage,) = s["usage"]
    assert usage.prompt_tokens == full.usage.prompt_tokens == len(tokenize(server, messages=MESSAGES))
    assert usage.completion_tokens == full.usage.completion_tokens == 20
    assert usage.total_tokens == usage.prompt_tokens + 20


def test_greedy_equals_offline(client, llm):
    prompts = [PROMPT, "Tom and his dog"]
    ref = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    got = client.completions.create(model=STORIES, prompt=prompts, max_tokens=24, temperature=0)
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [r.outputs[0].text for r in ref]
    assert [c.finish_reason for c in got.choices] == [r.outputs[0].finish_reason for r in ref]
    chat_ref = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    chat = client.chat.completions.create(model=STORIES, messages=MESSAGES, max_tokens=24, temperature=0)
    assert chat.choices[0].message.content == chat_ref.text


def test_n_choices_stream_equals_non_stream(server, client):
    kw = {"prompt": PROMPT, "max_tokens": 12, "n": 3, **SEEDED}
    full = client.completions.create(model=STORIES, **kw)
    assert [c.index for c in full.choices] == [0, 1, 2]
    texts = {c.index: c.text for c in full.choices}
    assert len(set(texts.values())) > 1, "each choice must get its own sample"
    s = stream_completion(client, stream_options={"include_usage": True}, **kw)
    assert dict(s["text"]) == texts and set(s["finish"]) == {0, 1, 2}
    assert s["usage"][0].completion_tokens == full.usage.completion_tokens
    assert full.usage.prompt_tokens == len(tokenize(server, prompt=PROMPT))  # once, not once per choice
    chat_full = client.chat.completions.create(model=STORIES, messages=MESSAGES, max_tokens=8, n=3, **SEEDED)
    chat = stream_chat(client, max_tokens=8, n=3, stream_options={"include_usage": True}, **SEEDED)
    assert dict(chat["text"]) == {c.index: c.message.content for c in chat_full.choices}
    assert chat["usage"][0].completion_tokens == chat_full.usage.completion_tokens
    assert all(r[0] == "assistant" and not any(r[1:]) for r in chat["roles"].values())


def test_several_prompts_with_n(server, client):
    full = client.completions.create(model=STORIES, prompt=[PROMPT, "Tom and his dog"], max_tokens=6, n=2, **SEEDED)
    assert [c.index for c in full.choices] == [0, 1, 2, 3]
    s = stream_completion(
        client, prompt=[PROMPT, "Tom and his dog"], max_tokens=6, n=2, stream_options={"include_usage": True}, **SEEDED
    )
    assert dict(s["text"]) == {c.index: c.text for c in full.choices}
    num_prompt = len(tokenize(server, prompt=PROMPT)) + len(tokenize(server, prompt="Tom and his dog"))
    assert s["usage"][0].prompt_tokens == full.usage.prompt_tokens == num_prompt


def test_completion_logprobs_match_offline(client, llm):
    ref = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False)[0].outputs[0]
    got = client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(ref.token_ids) == 8
    for mine, tok, row in zip(lp.token_logprobs, ref.token_ids, ref.logprobs):
        assert mine == pytest.approx(row[tok].logprob, abs=1e-4)
    assert all(len(top) >= 3 for top in lp.top_logprobs)
    # Greedy: the chosen token is the most likely one.
    assert all(max(top.values()) == pytest.approx(t) for top, t in zip(lp.top_logprobs, lp.token_logprobs))
    s = stream_completion(client, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    assert s["lp"][0] == pytest.approx(lp.token_logprobs, abs=1e-6)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # Each streamed chunk's first text_offset is the text streamed before it. Eight tokens of this tiny
    # model (a cached prompt) can all land in one chunk when the server's loop is a few ms late, so
    # the chunking is checked on a stream long enough to be split.
    long = stream_completion(
        client, prompt=PROMPT, max_tokens=64, temperature=0, logprobs=1, extra_body={"ignore_eos": True}
    )
    starts = long["offsets"][0]
    assert len(starts) > 1 and all(a == b for a, b in starts), f"(offset, chars streamed before): {starts}"


def test_chat_logprobs(client, llm):
    ref = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=6, logprobs=2), use_tqdm=False)[0].outputs[0]
    got = client.chat.completions.create(
        model=STORIES, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = got.choices[0].logprobs.content
    assert len(content) == 6
    for entry, tok, row in zip(content, ref.token_ids, ref.logprobs):
        assert entry.logprob == pytest.approx(row[tok].logprob, abs=1e-4)
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy
    s = stream_chat(client, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    assert s["lp"][0] == pytest.approx([e.logprob for e in content], abs=1e-6)


def test_echo(server, client):
    plain = client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=5, temperature=0).choices[0]
    echo = client.completions.create(
        model=STORIES, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1
    ).choices[0]
    assert echo.text == PROMPT + plain.text
    n_prompt = len(tokenize(server, prompt=PROMPT))
    assert echo.logprobs.token_logprobs[0] is None and len(echo.logprobs.token_logprobs) == n_prompt + 5
    assert all(isinstance(x, float) for x in echo.logprobs.token_logprobs[1:])
    s = stream_completion(client, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1)
    assert s["text"][0] == echo.text and s["lp"][0][0] is None and len(s["lp"][0]) == n_prompt + 5
    assert all(a == b for a, b in s["offsets"][0]), s["offsets"][0]


@pytest.mark.parametrize("include", [False, True])
def test_stop_string(server, client, include):
    kw = {
        "prompt": PROMPT,
        "max_tokens": 30,
        "temperature": 0,
        "stop": [" girl"],
        "extra_body": {"include_stop_str_in_output": include},
    }
    full = client.completions.create(model=STORIES, **kw).choices[0]
    assert full.finish_reason == "stop" and full.stop_reason == " girl"
    assert full.text == ", there was a little girl"[: None if include else -len(" girl")]
    s = stream_completion(client, **kw)
    assert s["text"][0] == full.text and s["finish"][0] == "stop" and s["stop_reason"][0] == " girl"
    assert s["usage"] == []  # no usage chunk unless stream_options asks for one
    there = tokenize(server, prompt=", there", add_special_tokens=False)[-1]
    by_id = client.completions.create(
        model=STORIES,
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        extra_body={"stop_token_ids": [there], "include_stop_str_in_output": include},
    )
    assert by_id.choices[0].stop_reason == there and by_id.choices[0].text == (", there" if include else ",")
    chat = client.chat.completions.create(
        model=STORIES,
        messages=MESSAGES,
        max_tokens=30,
        temperature=0,
        stop=["friend"],
        extra_body={"include_stop_str_in_output": include},
    )
    assert chat.choices[0].finish_reason == "stop"
    assert chat.choices[0].message.content.endswith("friend") == include


def test_token_id_prompts(server, client):
    ids_a, ids_b = tokenize(server, prompt=PROMPT), tokenize(server, prompt="Tom and his dog")
    assert ids_a[0] == 1  # BOS
    kw = {"max_tokens": 10, "temperature": 0}
    by_text = client.completions.create(model=STORIES, prompt=[PROMPT, "Tom and his dog"], **kw)
    by_ids = client.completions.create(model=STORIES, prompt=ids_a, **kw)
    assert by_ids.choices[0].text == by_text.choices[0].text
    both = client.completions.create(model=STORIES, prompt=[ids_a, ids_b], **kw)
    assert [(c.index, c.text) for c in both.choices] == [(c.index, c.text) for c in by_text.choices]
    assert both.usage.prompt_tokens == len(ids_a) + len(ids_b)
    echo = client.completions.create(model=STORIES, prompt=ids_b, echo=True, **kw).choices[0]
    assert echo.text.endswith("Tom and his dog" + by_text.choices[1].text)


def test_ignore_eos_and_min_tokens(client):
    force_eos = {"logit_bias": {"2": 100}}  # makes the EOS token (id 2) the certain next token
    ended = client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=8, temperature=0, **force_eos)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == 1
    assert ended.choices[0].stop_reason is None and ended.choices[0].text == ""  # EOS: no stop string/token
    ignored = client.completions.create(
        model=STORIES, prompt=PROMPT, max_tokens=7, temperature=0, **force_eos, extra_body={"ignore_eos": True}
    )
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == 7
    s = stream_completion(
        client,
        prompt=PROMPT,
        max_tokens=7,
        temperature=0,
        **force_eos,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )
    assert s["usage"][0].completion_tokens == 7 and s["finish"][0] == "length"
    delayed = client.completions.create(
        model=STORIES, prompt=PROMPT, max_tokens=8, temperature=0, **force_eos, extra_body={"min_tokens": 4}
    )
    # Four tokens that are not EOS, then the EOS (counted, as vLLM counts it).
    assert delayed.choices[0].finish_reason == "stop" and delayed.usage.completion_tokens == 5
    chat = client.chat.completions.create(
        model=STORIES, messages=MESSAGES, max_tokens=6, temperature=0, **force_eos, extra_body={"ignore_eos": True}
    )
    assert chat.usage.completion_tokens == 6 and chat.choices[0].finish_reason == "length"


def test_bad_requests_leave_nothing_behind(client):
    with pytest.raises(openai.BadRequestError, match="empty"):  # the first prompt was already submitted
        client.completions.create(model=STORIES, prompt=[[1, 403], []], max_tokens=3)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=STORIES, prompt=PROMPT, max_tokens=600)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=STORIES, messages=MESSAGES, max_tokens=3, top_logprobs=2)


def test_models_version_tokenize_health(server, client):
    (model,) = client.models.list().data
    assert model.id == STORIES
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert httpx.get(server.url + "/health").status_code == 200
    version = httpx.get(server.url + "/version").json()["version"]
    assert isinstance(version, str) and version
    ids = tokenize(server, prompt=PROMPT)
    assert ids[0] == 1 and tokenize(server, prompt=PROMPT, add_special_tokens=False) == ids[1:]
    detok = httpx.post(server.url + "/detokenize", json={"tokens": ids[1:]})
    assert detok.status_code == 200 and detok.json()["prompt"] == PROMPT
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10**6]}).status_code == 400


def metrics(server: RemoteServer) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def metric(values: dict, name: str, **labels: str) -> float:
    found = [v for (n, lab), v in values.items() if n == name and set(labels.items()) <= set(lab)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics(server, client):
    before = metrics(server)
    assert metric(before, "tram:num_requests_running", model_name=STORIES) == 0
    client.completions.create(
        model=STORIES, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = metrics(server)
    gen = "tram:generation_tokens_total"
    assert metric(after, gen) - metric(before, gen) == 5
    ok = "tram:request_success_total"
    assert metric(after, ok, finished_reason="length") - metric(before, ok, finished_reason="length") == 1
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        count = f"tram:{hist}_count"
        assert metric(after, count) - metric(before, count) == 1, hist
        assert metric(after, f"tram:{hist}_bucket", le="+Inf") == metric(after, count)
    itl = "tram:inter_token_latency_seconds_count"
    assert metric(after, itl) - metric(before, itl) == 4


GENERATE_BODY = {
    "prompt": "The capital of France is",
    "n": 1,
    "use_beam_search": False,
    "temperature": 0.7,
    "max_tokens": 10,
}


def test_generate_legacy(server, client):
    r = httpx.post(server.url + "/generate", json=GENERATE_BODY, timeout=60)
    assert r.status_code == 200, r.text
    (text,) = r.json()["text"]
    assert text.startswith(GENERATE_BODY["prompt"]) and len(text) > len(GENERATE_BODY["prompt"])
    greedy = {**GENERATE_BODY, "temperature": 0}
    (full,) = httpx.post(server.url + "/generate", json=greedy, timeout=60).json()["text"]
    comp = client.completions.create(model=STORIES, prompt=greedy["prompt"], max_tokens=10, temperature=0)
    assert full == greedy["prompt"] + comp.choices[0].text
    # Streamed: cumulative texts, the last one the whole. 64 tokens, since a loaded machine may send the
    # tokens of several steps as one line (10 came as one line there).
    long = {**greedy, "max_tokens": 64, "ignore_eos": True}
    (full,) = httpx.post(server.url + "/generate", json=long, timeout=60).json()["text"]
    with httpx.stream("POST", server.url + "/generate", json={**long, "stream": True}, timeout=60) as resp:
        texts = [json.loads(line)["text"][0] for line in resp.iter_lines() if line]
    assert len(texts) > 1 and texts[-1] == full
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts


def test_generate_beam_search(server):
    body = {**GENERATE_BODY, "use_beam_search": True, "n": 3, "temperature": 0}
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    texts = r.json()["text"]
    assert len(texts) == 3 and len(set(texts)) == 3
    assert all(t.startswith(body["prompt"]) and len(t) > len(body["prompt"]) for t in texts)
    # A beam of width 1 is greedy decoding: the same text, spaces at the prompt's edge included.
    greedy = {**body, "n": 1, "use_beam_search": False}
    (want,) = httpx.post(server.url + "/generate", json=greedy, timeout=60).json()["text"]
    (got,) = httpx.post(server.url + "/generate", json={**body, "n": 1}, timeout=60).json()["text"]
    assert got == want


def test_client_disconnect_aborts(server):
    """A client that goes away mid-request must not leave it running: nothing runs to its length
    limit, few of the requested tokens are generated, and no KV block stays in use."""
    before = metrics(server)
    long = {"model": STORIES, "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    body = {**long, "prompt": [PROMPT, "Tom and his dog"], "n": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
        assert next(line for line in resp.iter_lines() if line.startswith("data:"))
    chat_body = {**long, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat_body, timeout=30) as resp:
        assert next(line for line in resp.iter_lines() if line.startswith("data:"))
    with pytest.raises(httpx.ReadTimeout):  # 16 x 4 sequences of 500 tokens take seconds
        httpx.post(server.url + "/v1/completions", json={**long, "prompt": [PROMPT] * 16, "n": 4}, timeout=0.5)
    assert settled_kv(server)["blocks"]["in_use"] == 0
    after = metrics(server)
    ok = "tram:request_success_total"
    assert metric(after, ok, finished_reason="length") == metric(before, ok, finished_reason="length")
    generated = metric(after, "tram:generation_tokens_total") - metric(before, "tram:generation_tokens_total")
    assert generated < 0.5 * 500 * (4 + 1 + 64), generated  # sequences: 2 prompts x 2, 1 chat, 16 x 4
