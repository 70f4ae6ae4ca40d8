"""Incremental detokenization, stop strings, streaming deltas, and the tokenizer helpers.

The oracle is `tokenizer.decode` on the whole sequence: whatever the chunking, the incremental text
must equal the text of the generated part of decode(prompt + output).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, PreTrainedTokenizerFast

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.tokenizer import apply_chat_template, get_stop_token_ids, load_tokenizer

MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models", "stories260K"))
BOS, EOS = 1, 2
MULTIBYTE_TEXTS = [
    "Once upon a time there was a café.",
    "She said 日本語 is fun 😀 and ran.",
    "naïve résumé — 🎉🎉 done",
    "emoji at the end 😀",
    "😀😀 leading emoji",
]
HYPOTHESIS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def sp_tokenizer() -> PreTrainedTokenizerFast:
    return load_tokenizer(MODEL)


@functools.cache
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A small GPT-2 style byte-level BPE: multi-byte characters split across byte tokens."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    corpus = ["Once upon a time there was a café.", "日本語 is written here.", "😀 smiles at Lily."]
    backend.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def expected_text(tok: PreTrainedTokenizerFast, prompt: list[int], out: list[int], skip: bool = True) -> str:
    full = tok.decode(prompt + out, skip_special_tokens=skip)
    return full[len(tok.decode(prompt, skip_special_tokens=skip)) :]


def feed(
    detok: IncrementalDetokenizer, out: list[int], chunks: list[int] | None = None, valid_utf8: bool = True
) -> list[str]:
    """Feed `out` in chunks of the given sizes (cycled; token by token by default), return the deltas."""
    sizes = chunks or [1]
    deltas, i, k = [], 0, 0
    while i < len(out):
        size = sizes[k % len(sizes)]
        detok.update(out[i : i + size], stop_terminated=False)
        if valid_utf8:  # bytes are held until their character completes, never shown as U+FFFD
            assert "\ufffd" not in detok.output_text
        deltas.append(detok.get_next_output_text(finished=False, delta=True))
        i, k = i + size, k + 1
    deltas.append(detok.get_next_output_text(finished=True, delta=True))
    return deltas


# --- sequences of tokens that always form valid UTF-8 (byte-fallback tokens come in whole characters)


@functools.cache
def sp_units() -> list[list[int]]:
    tok = sp_tokenizer()
    byte_ids = {i for t, i in tok.get_vocab().items() if t.startswith("<0x")}
    words = [[i] for i in range(3, len(tok)) if i not in byte_ids]
    chars = []
    for ch in "é日本語😀€ñ🎉":
        ids = encode(tok, "a" + ch)[1:]  # drop the "▁a" piece so only the character's tokens remain
        assert len(ids) == 1 or all(i in byte_ids for i in ids)  # one piece, or whole byte run
        chars.append(ids)
    return words + chars * 20 + [[0], [BOS], [EOS]]


sp_sequences = st.lists(st.sampled_from(range(10_000)), max_size=40).map(
    lambda picks: [t for p in picks for t in sp_units()[p % len(sp_units())]]
)
chunkings = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@HYPOTHESIS
@given(out=sp_sequences, chunks=chunkings, skip=st.booleans(), prompt_text=st.sampled_from(["", "Once upon a", "日本"]))
def test_incremental_equals_full_decode_sentencepiece(out, chunks, skip, prompt_text):
    tok = sp_tokenizer()
    prompt = tok.encode(prompt_text) if prompt_text else [BOS]
    out = out + [403]  # end on a word so nothing is still held
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = feed(detok, out, chunks)
    assert detok.output_text == expected_text(tok, prompt, out, skip)
    assert "".join(deltas) == detok.output_text
    if prompt == [BOS] and skip:
        assert detok.output_text == tok.decode(out, skip_special_tokens=True)


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
@pytest.mark.parametrize("chunks", [[1], [2], [3, 1], [7]])
def test_real_multibyte_text_roundtrips(text, chunks):
    for tok, prompt in ((sp_tokenizer(), [BOS]), (byte_level_tokenizer(), [])):
        out = encode(tok, text)
        detok = IncrementalDetokenizer(tok, prompt)
        deltas = feed(detok, out, chunks)
        assert detok.output_text == tok.decode(out, skip_special_tokens=True)
        assert "".join(deltas) == detok.output_text


@HYPOTHESIS
@given(out=st.lists(st.integers(0, 308), max_size=30), last=st.sampled_from("abcxyz"), chunks=chunkings)
def test_byte_level_random_ids_match_full_decode(out, last, chunks):
    # Lossy UTF-8 decoding never rewrites finished characters, so even random ids must match.
    tok = byte_level_tokenizer()
    prompt = encode(tok, "Once upon")
    out = out + [tok.convert_tokens_to_ids(last)]
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = feed(detok, out, chunks, valid_utf8=False)
    assert detok.output_text == expected_text(tok, prompt, out)
    assert "".join(deltas) == detok.output_text


@HYPOTHESIS
@given(out=st.lists(st.integers(0, 511), max_size=40))
def test_malformed_byte_runs_never_crash_sentencepiece(out):
    # Byte fallback rewrites a finished run to U+FFFD when an invalid byte joins it; the stream
    # cannot take back what it emitted, but it must keep going and keep later text intact.
    tok = sp_tokenizer()
    detok = IncrementalDetokenizer(tok, tok.encode("Once upon a time"))
    for token_id in out + [383]:
        detok.update([token_id], stop_terminated=False)
    assert detok.output_text.endswith(" there")


def test_leading_space_after_prompt():
    tok = sp_tokenizer()
    once = tok.convert_tokens_to_ids("▁Once")
    detok = IncrementalDetokenizer(tok, tok.encode("The story"))
    detok.update([once], stop_terminated=False)
    assert detok.output_text == " Once"
    detok = IncrementalDetokenizer(tok, [BOS])  # nothing before it: decode() strips the space too
    detok.update([once], stop_terminated=False)
    assert detok.output_text == "Once"


def test_bytes_cut_off_at_the_end_are_held_not_replaced():
    tok = sp_tokenizer()
    out = encode(tok, "hi 😀")[:-2]  # the emoji's last two byte tokens never arrive
    detok = IncrementalDetokenizer(tok, [BOS])
    feed(detok, out)
    assert detok.output_text == "hi "


@pytest.mark.parametrize("prompt_text", ["Lily saw 日", "😀😀😀😀😀😀😀😀😀😀"])
def test_prompt_ending_inside_a_character(prompt_text):
    tok = sp_tokenizer()
    ids = tok.encode(prompt_text)
    prompt, out = ids[:-1], ids[-1:] + encode(tok, "ran")  # "▁ran"
    detok = IncrementalDetokenizer(tok, prompt)
    feed(detok, out)
    assert detok.output_text == prompt_text[-1] + " ran"  # the character completes; no prompt replay


# --- stop strings


def run_with_stop(text: str, stop: list[str], include: bool = False, chunks: list[int] | None = None):
    tok = sp_tokenizer()
    detok = IncrementalDetokenizer(tok, [BOS], stop=stop, include_stop_str_in_output=include)
    out, sizes, matched, deltas = encode(tok, text), chunks or [1], None, []
    i = k = 0
    while i < len(out) and matched is None:
        matched = detok.update(out[i : i + sizes[k % len(sizes)]], stop_terminated=False)
        deltas.append(detok.get_next_output_text(finished=matched is not None, delta=True))
        i, k = i + sizes[k % len(sizes)], k + 1
    return detok, matched, deltas


def test_stop_string_straddling_tokens_excluded_and_included():
    text = "Once upon a time there was a girl"
    detok, matched, _ = run_with_stop(text, ["upon a ti"])
    assert matched == "upon a ti" and detok.output_text == "Once "
    detok, matched, _ = run_with_stop(text, ["upon a ti"], include=True)
    assert matched == "upon a ti" and detok.output_text == "Once upon a ti"


def test_earliest_stop_string_wins_and_later_text_is_dropped():
    text = "Once upon a time there was a girl"
    for stop in (["girl", "there", "was"], ["was", "there", "girl"]):
        for chunks in ([1], [50]):
            detok, matched, _ = run_with_stop(text, stop, chunks=chunks)
            assert matched == "there" and detok.output_text == "Once upon a time "
    detok, _, _ = run_with_stop(text, ["there"], chunks=[50])
    assert detok.update(encode(sp_tokenizer(), " more"), stop_terminated=False) is None
    assert detok.output_text == "Once upon a time "


def test_stop_token_is_not_rendered_unless_included():
    tok = sp_tokenizer()
    out = encode(tok, "Once upon") + [EOS]
    # Without skipping specials the decoder sees "<s>" first, so the leading space survives.
    for include, want in ((False, " Once upon"), (True, " Once upon</s>")):
        detok = IncrementalDetokenizer(tok, [BOS], skip_special_tokens=False, include_stop_str_in_output=include)
        detok.update(out[:-1], stop_terminated=False)
        detok.update(out[-1:], stop_terminated=True)
        assert detok.output_text == want


def test_non_delta_streaming_holds_back_partial_stop():
    tok = sp_tokenizer()
    detok = IncrementalDetokenizer(tok, [BOS], stop=["xyzw"])
    detok.update(encode(tok, "Once upon"), stop_terminated=False)
    assert detok.get_next_output_text(finished=False, delta=False) == "Once u"
    assert detok.get_next_output_text(finished=True, delta=False) == "Once upon"


stop_alphabet = st.text(alphabet="ab é日", min_size=1, max_size=4)


@HYPOTHESIS
@given(
    text=st.text(alphabet="ab é日", min_size=1, max_size=40),
    stop=st.lists(stop_alphabet, min_size=1, max_size=3),
    include=st.booleans(),
    chunks=chunkings,
)
def test_stop_strings_against_oracle_and_streaming_never_leaks(text, stop, include, chunks):
    detok, matched, deltas = run_with_stop(text, stop, include, chunks)
    full = sp_tokenizer().decode(encode(sp_tokenizer(), text))
    hits = sorted((full.find(s) + len(s), full.find(s), s) for s in stop if s in full)
    if hits:
        end, start, want = hits[0]
        assert matched == want
        assert detok.output_text == (full[:end] if include else full[:start])
    else:
        assert matched is None and detok.output_text == full
        deltas.append(detok.get_next_output_text(finished=True, delta=True))
    streamed = ""
    for delta in deltas:
        streamed += delta
        assert detok.output_text.startswith(streamed)  # no delta is ever taken back
    assert streamed == detok.output_text


# --- the tokenizer helpers (single tokens' texts: test_logprob_tokens.py)


def test_stop_token_ids_of_stories260k():
    tok = sp_tokenizer()
    ids = get_stop_token_ids(MODEL, tok, AutoConfig.from_pretrained(MODEL))
    assert sorted(ids) == [1, 2]


def test_stop_token_ids_without_generation_config(tmp_path: Path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(MODEL) / name, tmp_path / name)
    tok = load_tokenizer(str(tmp_path))
    config = AutoConfig.from_pretrained(str(tmp_path))
    assert get_stop_token_ids(str(tmp_path), tok, config) == [2]


def test_chat_template_has_exactly_one_bos():
    tok = sp_tokenizer()
    messages = [{"role": "user", "content": "Tell me a story"}]
    for add_special in (False, True):
        ids = apply_chat_template(tok, messages, add_special_tokens=add_special)
        assert ids[0] == BOS and ids[1] != BOS and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids, skip_special_tokens=True) == "Tell me a story"


def test_missing_chat_template_raises_and_explicit_one_works():
    tok = byte_level_tokenizer()
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(tok, messages)
    ids = apply_chat_template(tok, messages, chat_template="{{ messages[0]['content'] }}")
    assert tok.decode(ids) == "hi"


def test_load_tokenizer_clear_error(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        load_tokenizer(str(tmp_path / "missing"))
