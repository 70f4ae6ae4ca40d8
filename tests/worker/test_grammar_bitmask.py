"""The grammar bitmask processor: bit j of word w allows token 32*w + j, only the step's constrained
rows change, and it runs before everything else the sampler does."""

from __future__ import annotations

import numpy as np
import torch

from tram.sampling_params import SamplingParams
from tram.worker.logits_processors import GrammarBitmaskProcessor, SamplingRow
from tram.worker.logits_processors.grammar_bitmask import unpack_bitmask
from tram.worker.sampler import Sampler
from tram.worker.sampling_metadata import build_sampling_metadata


def pack(allowed: list[set[int]], vocab: int) -> np.ndarray:
    words = -(-vocab // 32)
    out = np.zeros((len(allowed), words), dtype=np.uint32)
    for r, ids in enumerate(allowed):
        for t in ids:
            out[r, t // 32] |= np.uint32(1 << (t % 32))
    return out.view(np.int32)


def test_unpack_matches_the_bit_layout() -> None:
    vocab = 70  # a last word only partly used
    allowed = [{0, 31, 32, 63, 69}, set(range(vocab))]
    got = unpack_bitmask(torch.from_numpy(pack(allowed, vocab)), vocab)
    assert got.shape == (2, vocab)
    assert [set(torch.nonzero(row).flatten().tolist()) for row in got] == allowed


def test_only_the_constrained_rows_are_masked_and_greedy_follows_the_mask() -> None:
    vocab, rows = 100, [SamplingRow(SamplingParams(temperature=0), [1]) for _ in range(3)]
    processor = GrammarBitmaskProcessor(vocab, torch.device("cpu"))
    meta = build_sampling_metadata(rows, vocab, "cpu", [processor])
    logits = torch.randn(3, vocab)
    logits[:, 5] = 100.0  # every row's favourite
    original = logits.clone()
    processor.set_step([2, 0], pack([{7, 9}, {42}], vocab))
    sampled = Sampler()(logits, meta).sampled_token_ids.tolist()
    assert sampled[1] == 5  # unconstrained row untouched
    assert sampled[0] == 42
    assert sampled[2] == (7 if original[2, 7] > original[2, 9] else 9)
    processor.set_step(None)
    assert not processor.active


def test_sampled_rows_draw_only_allowed_tokens() -> None:
    vocab = 64
    rows = [SamplingRow(SamplingParams(temperature=1.0, seed=i), [1]) for i in range(4)]
    for i, r in enumerate(rows):
        r.generator = torch.Generator().manual_seed(i)
    processor = GrammarBitmaskProcessor(vocab, torch.device("cpu"))
    meta = build_sampling_metadata(rows, vocab, "cpu", [processor])
    allowed = [{1, 2, 3}, {60}, {10, 40}, {0}]
    for _ in range(20):
        processor.set_step([0, 1, 2, 3], pack(allowed, vocab))
        sampled = Sampler()(torch.randn(4, vocab), meta).sampled_token_ids.tolist()
        assert all(t in a for t, a in zip(sampled, allowed))
