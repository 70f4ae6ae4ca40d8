"""Logprob tokens add up to the text (`tram.engine.logprob_text` has the rule).

The chosen token's `decoded_token` is what it added in context (SentencePiece spaces kept, "" for
the bytes of an unfinished character and the whole character on the token that completes it),
so "".join(decoded tokens) == text wherever no stop string cut the text; alternatives show what
they would add after a word. Checked on the real stories260K model and tokenizer (byte fallback),
and, for byte-level BPE, on the small tokenizer of the detokenizer tests.
"""

from __future__ import annotations

import pytest

from tram import LLM, SamplingParams
from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.logprob_text import leading_token_text, token_text_table
from tram.engine.messages import EngineCoreOutput, LogprobsLists
from tram.engine.output_processor import OutputProcessor
from tram.sampling_params import RequestOutputKind

PROMPT = "Once upon a time, there was a little girl"
ARROW = [0xE2, 0x86, 0x92]  # "→" in UTF-8; stories260K has no piece for it, only byte fallback


def byte_id(b: int) -> int:
    return 3 + b  # stories260K: <unk> <s> </s>, then <0x00>..<0xFF>


def decoded(ids: list[int], rows: list[dict]) -> list[str]:
    return [row[t].decoded_token for t, row in zip(ids, rows)]


def test_sampled_tokens_add_up_to_the_text_with_their_spaces(llm: LLM):
    tok = llm.get_tokenizer()
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, logprobs=3), use_tqdm=False)[0]
    c = out.outputs[0]
    tokens = decoded(c.token_ids, c.logprobs)
    assert "".join(tokens) == c.text and len(c.text.split()) > 5
    # The spaces of '▁' pieces are where the text has them (the defect dropped every one).
    pieces = tok.convert_ids_to_tokens(c.token_ids)
    assert [t.startswith(" ") for t in tokens] == [p.startswith("▁") for p in pieces]
    assert tokens[:2] == [" named", " Lily"], tokens  # the greedy story; a change here is a model change


def test_alternatives_show_what_they_would_add_after_a_word(llm: LLM):
    tok = llm.get_tokenizer()
    word = tok.encode("a", add_special_tokens=False)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, logprobs=5), use_tqdm=False)[0]
    seen = 0
    for chosen, row in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        for tid, lp in row.items():
            if tid == chosen or tid in tok.all_special_ids:
                continue
            # The oracle: the tokenizer's full decode of the word and the token, less the word.
            assert lp.decoded_token == tok.decode(word + [tid])[len("a") :].replace("\ufffd", ""), tid
            seen += lp.decoded_token.startswith(" ")
    assert seen > 10  # most alternatives start a word: their space is there


def test_story_to_its_end_adds_up_and_the_stop_token_adds_nothing(llm: LLM):
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=400, logprobs=1), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == 1 and "\n" in c.text  # '\n' is <0x0A>
    tokens = decoded(c.token_ids, c.logprobs)
    assert tokens[-1] == "" and "".join(tokens) == c.text


def test_rendered_stop_token_is_its_text(llm: LLM, ref: dict):
    params = SamplingParams(
        temperature=0, max_tokens=5, logprobs=0, skip_special_tokens=False, include_stop_str_in_output=True
    )
    c = llm.generate({"prompt_token_ids": ref["story_end"]}, params, use_tqdm=False)[0].outputs[0]
    assert c.token_ids == [1] and c.text.strip() == "<s>"
    assert decoded(c.token_ids, c.logprobs) == [c.text]


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_the_text_not_the_tokens(llm: LLM, include: bool):
    params = SamplingParams(
        temperature=0, max_tokens=30, logprobs=1, stop=[" Lily"], include_stop_str_in_output=include
    )
    c = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    joined = "".join(decoded(c.token_ids, c.logprobs))
    assert c.stop_reason == " Lily" and c.text == (" named Lily" if include else " named")
    # The tokens holding the stop string keep their whole text: the text is a prefix of theirs.
    assert joined == " named Lily"


def test_prompt_tokens_add_up_to_the_prompt_bytes_included(llm: LLM):
    tok = llm.get_tokenizer()
    prompt = "Tom saw a → and 🙂"
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    ids, rows = out.prompt_token_ids, out.prompt_logprobs
    assert ids[0] == 1 and rows[0] is None  # BOS, which the prompt text does not show
    tokens = decoded(ids[1:], rows[1:])
    assert "".join(tokens) == prompt
    arrow = ids.index(byte_id(ARROW[0]))
    assert tokens[arrow - 1 : arrow + 2] == ["", "", "→"]  # bytes wait for the character to complete
    assert leading_token_text(prompt, tokens, "?") == ""  # what the server echoes for the BOS
    assert all("\ufffd" not in lp.decoded_token for row in rows[1:] for lp in row.values())
    assert tok.decode(ids, skip_special_tokens=True) == prompt


def test_output_completing_a_prompt_character(llm: LLM):
    tok = llm.get_tokenizer()
    prompt = tok.encode("Tom saw a ") + [byte_id(b) for b in ARROW[:2]]  # ends inside "→"
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3, logit_bias={byte_id(ARROW[2]): 100.0})
    c = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
    assert c.token_ids == [byte_id(ARROW[2])] and c.text == "→"
    assert decoded(c.token_ids, c.logprobs) == ["→"]


def test_bytes_of_a_character_that_never_completes_add_nothing(llm: LLM):
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=2, logit_bias={byte_id(0xE2): 100.0})
    c = llm.generate("Tom saw a", params, use_tqdm=False)[0].outputs[0]
    assert c.token_ids == [byte_id(0xE2)] * 3 and c.text == ""
    assert decoded(c.token_ids, c.logprobs) == ["", "", ""]


# ---- the output processor on synthetic core outputs: byte runs split across steps and chunks


def _rows(ids: list[int], alternatives: list[int]) -> LogprobsLists:
    values = [[-0.5] * (1 + len(alternatives))] * len(ids)
    return LogprobsLists([[t, *alternatives] for t in ids], values, [1] * len(ids))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_output_processor_byte_runs_in_any_chunking(ref: dict, chunk: int, kind: RequestOutputKind):
    tok = ref["tok"]
    ids = tok.encode("He said → and 🙂 ok", add_special_tokens=False)
    # Alternatives: the other arrows' last bytes ("←" "↑"), a word, and a lead byte alone.
    alternatives = [byte_id(0x90), byte_id(0x91), tok.encode("a big", add_special_tokens=False)[-1], byte_id(0xF0)]
    proc = OutputProcessor(tok)
    proc.add_request("r", None, [1], SamplingParams(max_tokens=len(ids), logprobs=4, output_kind=kind), ["r"], 0.0)
    text, rows = "", []
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        last = start + chunk >= len(ids)
        outs, _ = proc.process_outputs(
            [EngineCoreOutput("r", part, "length" if last else None, new_logprobs=_rows(part, alternatives))]
        )
        for o in outs:
            text += o.outputs[0].text
            rows += o.outputs[0].logprobs
    assert text == "He said → and 🙂 ok"
    tokens = decoded(ids, rows)
    assert "".join(tokens) == text and tokens[2:6] == [" ", "", "", "→"]
    arrow_end = ids.index(byte_id(0x92))
    alt_texts = [rows[arrow_end][t].decoded_token for t in alternatives]
    # Where "\xe2\x86" is pending, the other last bytes would complete other arrows.
    assert alt_texts == ["←", "↑", " big", ""]
    assert [rows[0][t].decoded_token for t in alternatives] == ["", "", " big", ""]


# ---- the table: bytes for chat, on byte fallback and on byte-level BPE


def test_token_bytes_add_up_to_the_text(ref: dict):
    from test_detokenizer import byte_level_tokenizer

    for tok, prompt in ((ref["tok"], [1]), (byte_level_tokenizer(), [])):
        table = token_text_table(tok)
        text = "She said 日本語 is fun 😀 and ran → café"
        ids = tok.encode(text, add_special_tokens=False)
        detok = IncrementalDetokenizer(tok, prompt)
        detok.update(ids, stop_terminated=False)
        texts = detok.last_texts
        assert "".join(texts) == detok.output_text == text
        token_bytes = [table.token_bytes(t, s) for t, s in zip(ids, texts)]
        assert sum(token_bytes, []) == list(text.encode("utf-8"))
        assert [] not in token_bytes  # every token of this text carries bytes
        # A partial-character token: its text is "", its bytes are its own.
        partial = next(i for i, s in enumerate(texts) if s == "")
        assert token_bytes[partial] and token_bytes[partial][0] >= 0x80


def test_stories_byte_fallback_token_bytes(ref: dict):
    table = token_text_table(ref["tok"])
    assert table.token_bytes(byte_id(0xE2), "") == [0xE2]
    assert table.token_bytes(byte_id(0x0A), "\n") == [0x0A]
    assert table.token_bytes(ref["tok"].encode("a big", add_special_tokens=False)[-1], " big") == list(b" big")
    assert table.alternative(1) == "<s>" and table.alternative(byte_id(0xE2)) == ""


def test_every_alternative_text_on_both_tokenizers(ref: dict):
    from test_detokenizer import byte_level_tokenizer

    for tok in (ref["tok"], byte_level_tokenizer()):
        table = token_text_table(tok)
        word = tok.encode("a", add_special_tokens=False)
        for tid in range(len(tok)):
            if tid in tok.all_special_ids:
                assert table.alternative(tid) == tok.convert_ids_to_tokens(tid)
            else:  # the oracle: the full decode after a word, less the word and any U+FFFD
                assert table.alternative(tid) == tok.decode(word + [tid])[len("a") :].replace("\ufffd", ""), tid
