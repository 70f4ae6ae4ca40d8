"""The rejection sampler alone: greedy drafts kept exactly while they are the argmax, sampled output
tokens distributed as the target model's own draws (chi-square over many rows at once), and a seeded
row's tokens and generator exactly those of plain decoding."""

from __future__ import annotations

import torch

from tram.sampling_params import SamplingParams
from tram.worker.rejection_sampler import DraftRows, verify_drafts
from tram.worker.sampler import apply_top_k_top_p, exponential_race
from tram.worker.sampling_metadata import SamplingRow, build_sampling_metadata

V = 8
# The 99.9% point of chi-square with V - 1 = 7 degrees of freedom: a correct sampler fails once in
# a thousand seeds; the tests use fixed seeds, so they fail only if the distribution is wrong.
CHI2_7_999 = 24.32


def _meta(params: list[SamplingParams]):
    rows = []
    for p in params:
        gen = None
        if p.seed is not None:
            gen = torch.Generator()
            gen.manual_seed(p.seed)
        rows.append(SamplingRow(p, [0], [], gen))
    return build_sampling_metadata(rows, V, "cpu")


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    logits = torch.full((5, V), -5.0)
    for pos, best in enumerate([3, 4, 6, 1, 2]):
        logits[pos, best] = 5.0
    # Row 0: drafts 3, 4, 7 (the third is wrong: the argmax there is 6). Row 1: drafts 1, 2, both right.
    d = DraftRows([0, 1], [[3, 4, 7], [1, 2]], logits)
    out = verify_drafts(d, bonus=[0, 5], meta=_meta([SamplingParams(temperature=0)] * 2))
    assert out == [[3, 4, 6], [1, 2, 5]]


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _target(logits: torch.Tensor, temperature: float, top_k: int = 0) -> torch.Tensor:
    scaled = logits / temperature
    if top_k:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, -1)


def test_sampled_tokens_follow_the_target_distribution():
    """20,000 rows, each with the same two drafts: the first output token must follow p_0, and the
    second, where the first draft was accepted, p_1 (with temperature and top-k applied)."""
    torch.manual_seed(0)
    n = 20_000
    p0_logits, p1_logits, bonus_logits = torch.randn(3, V) * 1.5
    draft0 = int(p0_logits.argmax())  # a likely draft, so both branches are exercised
    draft1 = int(p1_logits.argsort()[-2])
    params = SamplingParams(temperature=0.8, top_k=6)
    logits = torch.stack([p0_logits, p1_logits]).repeat(n, 1)  # [2n, V]: row i's positions 2i, 2i + 1
    p_bonus = _target(bonus_logits, 0.8, 6)
    bonus = torch.multinomial(p_bonus, n, replacement=True).tolist()  # the ordinary sampler's draw at position 2
    out = verify_drafts(DraftRows(list(range(n)), [[draft0, draft1]] * n, logits), bonus, _meta([params] * n))
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=V).float()
    assert _chi2(first, _target(p0_logits, 0.8, 6)) < CHI2_7_999
    second = torch.bincount(torch.tensor([o[1] for o in out if o[0] == draft0]), minlength=V).float()
    assert second.sum() > 2000
    assert _chi2(second, _target(p1_logits, 0.8, 6)) < CHI2_7_999
    third = [o[2] for o in out if o[:2] == [draft0, draft1]]
    assert third and all(len(o) <= 3 for o in out)
    accepted_first = float((first[draft0] / n).item())
    assert abs(accepted_first - float(_target(p0_logits, 0.8, 6)[draft0])) < 0.02


def test_a_draft_of_probability_zero_is_always_rejected_and_never_drawn():
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0, -2.0, -3.0, -4.0, -5.0]]).repeat(2000, 1)
    # top_k=3 filters token 5 out: the draft can never be accepted, nor drawn in its place.
    out = verify_drafts(
        DraftRows(list(range(2000)), [[5]] * 2000, logits), [0] * 2000, _meta([SamplingParams(top_k=3)] * 2000)
    )
    tokens = torch.tensor([o[0] for o in out])
    assert all(len(o) == 1 for o in out) and set(tokens.tolist()) <= {0, 1, 2}
    assert _chi2(torch.bincount(tokens, minlength=V).float(), _target(logits[0], 1.0, 3)) < 13.8  # 99.9%, 2 df


def test_seeded_rows_repeat_themselves_and_mixed_batches_verify_each_row_its_way():
    torch.manual_seed(1)
    logits = torch.randn(6, V)
    drafts = [[1, 2, 3], [4, 5], [6]]
    params = [SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0), SamplingParams(temperature=0.5)]

    last = torch.randn(3, V)

    def run() -> list[list[int]]:
        torch.manual_seed(99)  # the unseeded row draws from the global generator
        return verify_drafts(DraftRows([0, 1, 2], drafts, logits.clone(), last.clone()), [0, 1, 2], _meta(params))

    first, again = run(), run()
    assert first == again
    greedy = logits[3:5].argmax(-1).tolist()
    expected = [4, 5][: next((j for j in range(2) if greedy[j] != [4, 5][j]), 2)]
    assert first[1][: len(expected)] == expected
    alone = DraftRows([0], drafts[:1], logits[:3].clone(), last[:1].clone())
    seeded_alone = verify_drafts(alone, [0], _meta(params[:1]))
    assert seeded_alone[0] == first[0], "a seeded row's draws must not depend on the rest of the batch"


def test_a_seeded_row_draws_what_plain_decoding_draws():
    """Plain decoding draws position j's token from the row's generator at step j; verification must
    give the same tokens, and leave the generator where plain decoding would (the next step's draw)."""
    torch.manual_seed(3)
    logits = torch.randn(5, V) * 2  # positions 0..3 verify drafts, 4 is past the last draft
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    meta = _meta([params])
    plain_gen = torch.Generator()
    plain_gen.manual_seed(1234)
    plain = []
    for j in range(5):  # the sampler's own steps: temperature, top-p, the race
        row = apply_top_k_top_p(logits[j : j + 1] / 0.9, None, torch.tensor([0.95]), 0)
        plain.append(int(exponential_race(torch.softmax(row, -1), {0: plain_gen})))
    for wrong_at in (1, 3, None):  # a draft that differs from plain decoding's token there, or none
        drafts = [t if j != wrong_at else (t + 1) % V for j, t in enumerate(plain[:4])]
        meta = _meta([params])
        out = verify_drafts(DraftRows([0], [drafts], logits[:4].clone(), logits[4:].clone()), [-1], meta)
        n = 5 if wrong_at is None else wrong_at + 1
        assert out == [plain[:n]]
        replay = torch.Generator()
        replay.manual_seed(1234)
        torch.empty(n, V).uniform_(generator=replay)  # what n plain steps drew
        assert torch.equal(meta.generators[0].get_state(), replay.get_state())
