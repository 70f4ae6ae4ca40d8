"""TextBuffer against a plain `str` model, and the bounded cost of the detokenizer built on it."""

from __future__ import annotations

import functools
import os
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from tram.engine.detokenizer import IncrementalDetokenizer
from tram.engine.text_buffer import TextBuffer
from tram.engine.tokenizer import load_tokenizer

MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models", "stories260K"))

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.text(alphabet="ab日😀", max_size=5)),
        st.tuples(st.just("truncate"), st.integers(0, 30)),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, start=st.integers(-3, 400), width=st.integers(0, 40))
def test_buffer_equals_a_plain_string(ops, start, width):
    buf, model = TextBuffer(), ""
    for op, arg in ops:
        if op == "append":
            buf.append(arg)
            model += arg
        else:  # cut off up to `arg` characters at the end
            buf.truncate(max(len(model) - arg, 0))
            model = model[: max(len(model) - arg, 0)]
        assert len(buf) == len(model)
        assert buf.suffix(len(model) - 7) == model[max(len(model) - 7, 0) :]
    assert buf.suffix(start) == model[max(start, 0) :]
    assert buf.slice(start, start + width) == model[max(start, 0) : max(start + width, 0)]
    assert buf.text() == model
    assert buf.text() == model  # again, after collapsing into one piece
    buf.append("z")
    assert buf.text() == model + "z"


def test_pieces_are_compacted():
    buf = TextBuffer()
    for i in range(10_000):
        buf.append(str(i % 10))
    assert len(buf._pieces) <= 10_000 // 64 + 64
    assert buf.suffix(9_990) == "0123456789"


@functools.cache
def tokenizer():
    return load_tokenizer(MODEL)


def _bytes_for_steps(history_tokens: int, steps: int = 64) -> int:
    """Bytes allocated (traced peak above the start) by `steps` single-token updates and deltas
    after `history_tokens` tokens of output, with a stop string that never matches."""
    tok = tokenizer()
    word = tok.encode("Once upon a time there was a girl", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [1], stop=["never ever seen"])
    for i in range(history_tokens):
        detok.update([word[i % len(word)]], stop_terminated=False)
    detok.get_next_output_text(finished=False, delta=True)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        deltas = []
        for i in range(steps):
            detok.update([word[i % len(word)]], stop_terminated=False)
            deltas.append(detok.get_next_output_text(finished=False, delta=True))
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_detokenizer_step_cost_does_not_grow_with_the_text():
    short, long = _bytes_for_steps(64), _bytes_for_steps(20_000)
    # The old `output_text += new_text` copied ~100 KB per step at 20,000 tokens.
    assert long < 2 * short + 4096, (short, long)
