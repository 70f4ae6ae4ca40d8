"""SamplingParams: vLLM defaults, validation messages, normalisation and msgspec transport."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tram.sampling_params import SamplingParams, SamplingType

VLLM_DEFAULTS = dict(
    n=1,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    seed=None,
    stop=[],
    stop_token_ids=[],
    ignore_eos=False,
    max_tokens=16,
    min_tokens=0,
    logprobs=None,
    prompt_logprobs=None,
    detokenize=True,
    skip_special_tokens=True,
    spaces_between_special_tokens=True,
    include_stop_str_in_output=False,
    logit_bias=None,
)


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    for name, value in VLLM_DEFAULTS.items():
        assert getattr(p, name) == value, name
    assert p.sampling_type == SamplingType.RANDOM


INVALID = [
    ("n", 0),
    ("n", -3),
    ("n", 1.5),
    ("temperature", -0.1),
    ("temperature", math.inf),
    ("temperature", math.nan),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", -0.5),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 2.5),
    ("top_k", True),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -2.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("logprobs", -2),
    ("logprobs", 1.0),
    ("prompt_logprobs", -5),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", [3]),
    ("stop", 5),
    ("stop_token_ids", ["a"]),
    ("stop_token_ids", [1.5]),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", 7),
    ("seed", "abc"),
    ("seed", 1.5),
    ("seed", 2**64),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {1: "a"}),
    ("logit_bias", {1: math.inf}),
    ("logit_bias", [1, 2]),
]


@pytest.mark.parametrize("field,value", INVALID)
def test_invalid_value_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens() -> None:
    with pytest.raises(ValueError, match="min_tokens.*max_tokens"):
        SamplingParams(min_tokens=10, max_tokens=5)
    assert SamplingParams(min_tokens=100, max_tokens=None).min_tokens == 100


def test_error_messages_state_the_range() -> None:
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        SamplingParams(top_p=2.0)
    with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\]"):
        SamplingParams(min_p=2.0)
    with pytest.raises(ValueError, match=r"presence_penalty must be in \[-2, 2\]"):
        SamplingParams(presence_penalty=9)


def test_stop_strings_need_detokenize() -> None:
    with pytest.raises(ValueError, match="stop.*detokenize"):
        SamplingParams(stop="x", detokenize=False)


def test_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=(5, 6), top_k=-1, temperature=1, logit_bias={"7": -100, 8: 2})
    assert p.stop == ["###"] and p.stop_token_ids == [5, 6] and p.top_k == 0
    assert isinstance(p.temperature, float)
    assert p.logit_bias == {7: -100.0, 8: 2.0}


def test_greedy_normalises_filters() -> None:
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.3, seed=3)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert p.sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=1e-6).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.7, seed=1).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(temperature=0.7).sampling_type == SamplingType.RANDOM


def test_verify_token_ids() -> None:
    SamplingParams(logit_bias={5: 1.0}, stop_token_ids=[9]).verify_token_ids(10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={10: 1.0}).verify_token_ids(10)
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[10]).verify_token_ids(10)


def test_clone_is_deep() -> None:
    p = SamplingParams(stop=["a"], stop_token_ids=[1], logit_bias={1: 1.0})
    c = p.clone()
    c.stop.append("b")
    c.stop_token_ids.append(2)
    c.logit_bias[2] = 3.0
    assert p.stop == ["a"] and p.stop_token_ids == [1] and p.logit_bias == {1: 1.0}


def test_msgpack_round_trip() -> None:
    p = SamplingParams(
        n=2, temperature=0.3, top_k=4, seed=11, stop=["x"], logprobs=-1, max_tokens=None, logit_bias={3: -1.5}
    )
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams)
    assert back == p and back.max_tokens is None and back.logit_bias == {3: -1.5}


def test_defaults_encode_small() -> None:
    encoded = msgspec.msgpack.encode(SamplingParams())
    assert msgspec.msgpack.decode(encoded) == {} and len(encoded) <= 3


def test_json_decode_accepts_string_logit_bias_keys() -> None:
    p = msgspec.json.decode(b'{"logit_bias": {"50256": -100}, "stop": "END"}', type=SamplingParams)
    assert p.logit_bias == {50256: -100.0} and p.stop == ["END"]


def test_decode_validates() -> None:
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        msgspec.json.decode(b'{"top_p": 0}', type=SamplingParams)


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.floats(0.0, 5.0),
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(-1, 100),
    min_p=st.floats(0.0, 1.0),
    pres=st.floats(-2.0, 2.0),
    rep=st.floats(0.01, 5.0),
    seed=st.none() | st.integers(-(2**63), 2**64 - 1),
    max_tokens=st.none() | st.integers(1, 4096),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3),
    bias=st.dictionaries(st.integers(0, 1000), st.floats(-100.0, 100.0), max_size=3),
)
def test_valid_params_round_trip(
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    pres: float,
    rep: float,
    seed: int | None,
    max_tokens: int | None,
    stop: list[str],
    bias: dict[int, float],
) -> None:
    p = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        presence_penalty=pres,
        repetition_penalty=rep,
        seed=seed,
        max_tokens=max_tokens,
        stop=stop,
        logit_bias=bias,
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
    assert msgspec.json.decode(msgspec.json.encode(p), type=SamplingParams) == p
