"""`spaces_between_special_tokens`, as vLLM's fast detokenizer honours it: with False, an added
token right after another added token is its bare content, without the space a decoder may put
before it; with True (the default), whatever the decoder produces. Only with skip_special_tokens=False.
"""

from __future__ import annotations

import functools
import os

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.tokenizer import load_tokenizer

MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models", "stories260K"))
BOS, EOS, DO = 1, 2, 400  # <s>, </s>, "▁do"


@functools.cache
def stories():
    return load_tokenizer(MODEL)


@functools.cache
def wordpiece():
    """BERT-style: the WordPiece decoder joins every token with a space, added tokens included."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "##s": 5}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens(["[UNK]", "[CLS]", "[SEP]"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def detokenize(tok, prompt: list[int], out: list[int], spaces: bool, skip: bool = False) -> str:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    for token_id in out:
        detok.update([token_id], stop_terminated=False)
    return detok.output_text


def test_stories260k_puts_no_space_between_special_tokens():
    # What the tokenizer itself does: its decoder (Replace "▁", byte fallback, Fuse, Strip) renders
    # added tokens as their content, so adjacent specials are already glued together.
    tok = stories()
    assert tok.decode([BOS, EOS, BOS], skip_special_tokens=False) == "<s></s><s>"
    prompt = tok.encode("Once upon a time")
    out = [EOS, BOS, BOS, DO, EOS]
    for spaces in (True, False):
        assert detokenize(tok, prompt, out, spaces) == "</s><s><s> do</s>"
        assert detokenize(tok, prompt, out, spaces, skip=True) == " do"


@pytest.mark.parametrize(
    "spaces,want", [(True, "hello [CLS] [SEP] world [SEP]"), (False, "hello [CLS][SEP] world [SEP]")]
)
def test_wordpiece_spaces_between_added_tokens(spaces, want):
    tok = wordpiece()
    out = [3, 1, 2, 4, 2]  # hello [CLS] [SEP] world [SEP]
    assert tok.decode(out, skip_special_tokens=False) == "hello [CLS] [SEP] world [SEP]"
    assert detokenize(tok, [4], out, spaces) == " " + want


def test_first_output_token_after_a_prompt_ending_in_an_added_token():
    tok = wordpiece()
    assert detokenize(tok, [3, 1], [2, 5], spaces=True) == " [SEP]s"
    assert detokenize(tok, [3, 1], [2, 5], spaces=False) == "[SEP]s"


def test_skipped_specials_ignore_the_flag():
    tok = wordpiece()
    for spaces in (True, False):
        assert detokenize(tok, [4], [3, 1, 2, 4], spaces, skip=True) == " hello world"
