"""Sampler: greedy, seeded and random draws, filters, penalties, masks and logprobs."""

from __future__ import annotations

import pytest
import torch

from tram.sampling_params import SamplingParams
from tram.worker.sampler import Sampler, SamplerOutput, apply_logits_processors, compute_token_logprobs
from tram.worker.sampling_metadata import SamplingRow, build_sampling_metadata

V = 32
sampler = Sampler()


@pytest.fixture(autouse=True)
def _fixed_global_rng() -> None:
    # Unseeded rows draw from the global generator; fixing it keeps the statistical tests stable.
    torch.manual_seed(0)


def row(
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    generator: torch.Generator | None = None,
    stop_ids: set[int] | None = None,
) -> SamplingRow:
    return SamplingRow(
        params=params,
        prompt_token_ids=prompt or [1, 2, 3],
        output_token_ids=output or [],
        generator=generator,
        min_tokens_masked_ids=frozenset(stop_ids or ()),
    )


def run(logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
    meta = build_sampling_metadata(rows, vocab_size=logits.shape[-1], device="cpu")
    return sampler(logits.clone(), meta)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_logits(batch: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=seeded(seed)) * 2


GREEDY = SamplingParams(temperature=0.0)


def test_greedy_is_argmax_and_metadata_is_minimal() -> None:
    logits = random_logits(6)
    rows = [row(GREEDY) for _ in range(6)]
    meta = build_sampling_metadata(rows, V, "cpu")
    assert meta.all_greedy and not meta.all_random and meta.temperature is None
    assert meta.no_penalties and meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.max_num_logprobs is None and meta.min_tokens_mask is None and meta.logit_bias is None
    out = sampler(logits.clone(), meta)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1)) and out.logprobs is None


def test_mixed_greedy_and_random_rows() -> None:
    logits = random_logits(8)
    params = [GREEDY if i % 2 == 0 else SamplingParams(temperature=5.0) for i in range(8)]
    seen_random: set[int] = set()
    for _ in range(30):
        out = run(logits, [row(p) for p in params]).sampled_token_ids
        assert torch.equal(out[0::2], logits[0::2].argmax(-1))
        seen_random.update(out[1::2].tolist())
    assert len(seen_random) > 4  # hot random rows really sample


def _seeded_stream(position: int, batch: int, steps: int, seed: int, neighbour_seed: int) -> list[int]:
    gen = seeded(seed)
    logits_gen = seeded(99)
    tokens = []
    for _ in range(steps):
        logits = torch.randn(batch, V, generator=logits_gen)
        target = torch.randn(V, generator=seeded(len(tokens)))  # same row logits in every layout
        logits[position] = target
        rows = [
            row(
                SamplingParams(temperature=0.8, top_k=5 + i, seed=neighbour_seed + i),
                generator=seeded(neighbour_seed + i),
            )
            if i % 2
            else row(SamplingParams(top_p=0.9))
            for i in range(batch)
        ]
        rows[position] = row(SamplingParams(temperature=1.3, top_p=0.95, seed=seed), generator=gen)
        tokens.append(int(run(logits, rows).sampled_token_ids[position]))
    return tokens


def test_seeded_rows_reproducible_across_batches_and_positions() -> None:
    alone = _seeded_stream(position=0, batch=1, steps=12, seed=1234, neighbour_seed=0)
    assert alone == _seeded_stream(position=3, batch=6, steps=12, seed=1234, neighbour_seed=50)
    assert alone == _seeded_stream(position=1, batch=9, steps=12, seed=1234, neighbour_seed=7)
    assert alone != _seeded_stream(position=0, batch=1, steps=12, seed=4321, neighbour_seed=0)


def test_unseeded_sampling_follows_distribution() -> None:
    n = 4000
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    for temperature in (1.0, 0.5):
        logits = base.repeat(n, 1)
        out = run(logits, [row(SamplingParams(temperature=temperature)) for _ in range(n)])
        freq = torch.bincount(out.sampled_token_ids, minlength=6).float() / n
        expected = torch.softmax(base / temperature, -1)
        assert torch.allclose(freq, expected, atol=0.03), (freq, expected)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
        SamplingParams(top_k=1, top_p=0.5, temperature=3.0),
    ],
)
def test_filters_collapse_to_argmax(params: SamplingParams) -> None:
    logits = random_logits(64, seed=3)
    out = run(logits, [row(params) for _ in range(64)])
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


def _allowed_top_k(logits: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(logits, k).indices.tolist())


def _allowed_top_p(logits: torch.Tensor, p: float) -> set[int]:
    probs, idx = torch.softmax(logits, -1).sort(descending=True)
    keep = (probs.cumsum(-1) - probs) < p  # mass before this token has not reached p yet
    return set(idx[keep].tolist())


def _allowed_min_p(logits: torch.Tensor, p: float) -> set[int]:
    probs = torch.softmax(logits, -1)
    return set(torch.nonzero(probs >= p * probs.max()).flatten().tolist())


@pytest.mark.parametrize(
    "params,allowed",
    [
        (SamplingParams(top_k=5, temperature=2.0), lambda l: _allowed_top_k(l, 5)),
        (SamplingParams(top_p=0.6, temperature=2.0), lambda l: _allowed_top_p(l / 2.0, 0.6)),
        (SamplingParams(min_p=0.2, temperature=2.0), lambda l: _allowed_min_p(l / 2.0, 0.2)),
        (
            SamplingParams(top_k=8, top_p=0.7),
            lambda l: (
                _allowed_top_k(l, 8)
                & _allowed_top_p(l.masked_fill(l < torch.topk(l, 8).values[-1], float("-inf")), 0.7)
            ),
        ),
    ],
)
def test_filters_never_sample_outside_their_set(params: SamplingParams, allowed) -> None:
    n = 3000
    base = random_logits(1, seed=5)[0]
    permitted = allowed(base)
    out = run(base.repeat(n, 1), [row(params) for _ in range(n)])
    drawn = set(out.sampled_token_ids.tolist())
    assert drawn <= permitted
    assert len(drawn) == len(permitted)  # and the whole set is reachable


def test_filters_are_per_row() -> None:
    base = random_logits(1, seed=8)[0]
    params = [SamplingParams(top_k=1), SamplingParams(temperature=4.0), SamplingParams(top_k=2, top_p=0.999)]
    seen: list[set[int]] = [set(), set(), set()]
    for _ in range(40):
        out = run(base.repeat(3, 1), [row(p) for p in params]).sampled_token_ids.tolist()
        for s, t in zip(seen, out):
            s.add(t)
    assert seen[0] == {int(base.argmax())}
    assert len(seen[1]) > 3
    assert seen[2] <= _allowed_top_k(base, 2)


def _reference_penalties(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    out = logits.clone()
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return out


def test_penalties_match_reference() -> None:
    logits = random_logits(4, seed=11)
    cases = [
        (SamplingParams(temperature=0, repetition_penalty=1.7), [1, 2, 2], [5, 5, 6]),
        (SamplingParams(temperature=0, frequency_penalty=0.9, presence_penalty=-0.4), [3], [7, 7, 7, 8, 1]),
        (
            SamplingParams(temperature=0, repetition_penalty=0.6, frequency_penalty=-1.0, presence_penalty=2.0),
            [9, 10, 11, 12],
            [],
        ),
        (SamplingParams(temperature=0), [4, 4], [4, 13]),  # neutral row in a penalised batch
    ]
    rows = [row(p, prompt, output) for p, prompt, output in cases]
    meta = build_sampling_metadata(rows, V, "cpu")
    got = apply_logits_processors(logits.clone(), meta)
    for i, (p, prompt, output) in enumerate(cases):
        torch.testing.assert_close(got[i], _reference_penalties(logits[i], p, prompt, output))
    assert torch.equal(got[3], logits[3])


def test_only_repetition_needs_prompt_tokens() -> None:
    meta = build_sampling_metadata([row(SamplingParams(presence_penalty=0.5), output=[1])], V, "cpu")
    assert meta.penalties.touched[0].nonzero().flatten().tolist() == [1]  # its output, not its prompt
    meta = build_sampling_metadata([row(SamplingParams(repetition_penalty=1.2), output=[9])], V, "cpu")
    assert meta.penalties.touched[0].nonzero().flatten().tolist() == [1, 2, 3, 9]


def test_min_tokens_masks_stop_ids_including_eos() -> None:
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[7], ignore_eos=True)
    logits = torch.zeros(1, V)
    logits[0, 2], logits[0, 7], logits[0, 9] = 10.0, 9.0, 8.0
    assert run(logits, [row(params, output=[1], stop_ids={2, 7})]).sampled_token_ids.item() == 9
    # stop ids the runner passes in (the model's eos) are masked too
    runner_stop = row(SamplingParams(temperature=0, min_tokens=1), stop_ids={2})
    assert run(logits, [runner_stop]).sampled_token_ids.item() == 7
    assert run(logits, [row(params, output=[1, 1, 1], stop_ids={2, 7})]).sampled_token_ids.item() == 2


def test_logit_bias() -> None:
    logits = random_logits(2, seed=4)
    low = int(logits[0].argmin())
    params = SamplingParams(temperature=0, logit_bias={str(low): 100})
    out = run(logits, [row(params), row(GREEDY)]).sampled_token_ids
    assert out[0].item() == low and out[1].item() == int(logits[1].argmax())
    banned = int(logits[1].argmax())
    out = run(logits, [row(GREEDY), row(SamplingParams(temperature=0, logit_bias={banned: float("-inf")}))])
    assert out.sampled_token_ids[1].item() != banned


def _check_logprobs(logits: torch.Tensor, sampled: torch.Tensor, lp, k: int) -> None:
    ref = torch.log_softmax(logits, -1)
    assert lp.token_ids.shape == (logits.shape[0], k + 1) == lp.logprobs.shape
    assert torch.equal(lp.token_ids[:, 0], sampled)
    torch.testing.assert_close(lp.logprobs, ref.gather(-1, lp.token_ids))
    if k:
        torch.testing.assert_close(lp.logprobs[:, 1:], torch.topk(ref, k).values)
    for i, t in enumerate(sampled.tolist()):
        assert lp.ranks[i].item() == 1 + int((ref[i] > ref[i, t]).sum())


def test_logprobs_are_raw_and_ranked() -> None:
    logits = random_logits(5, seed=21)
    params = [
        SamplingParams(logprobs=3, temperature=0.7, top_k=4, repetition_penalty=1.5),
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(),
        SamplingParams(logprobs=1, seed=3),
        SamplingParams(temperature=2.0, presence_penalty=1.0),
    ]
    original = logits.clone()
    meta = build_sampling_metadata([row(p, output=[4, 5]) for p in params], V, "cpu")
    out = sampler(logits, meta)
    assert torch.equal(logits, original)  # raw logits untouched when logprobs are wanted
    assert meta.max_num_logprobs == 3
    _check_logprobs(logits, out.sampled_token_ids, out.logprobs, 3)
    assert out.sampled_token_ids[1].item() == int(logits[1].argmax()) and out.logprobs.ranks[1].item() == 1


def test_logprobs_whole_vocab() -> None:
    logits = random_logits(2, seed=22)
    out = run(logits, [row(SamplingParams(logprobs=-1)), row(GREEDY)])
    _check_logprobs(logits, out.sampled_token_ids, out.logprobs, V)
    ids, lps, ranks = out.logprobs.tolists()
    assert len(ids[0]) == V + 1 and isinstance(lps[0][0], float) and isinstance(ranks[0], int)


def test_compute_token_logprobs_for_prompt() -> None:
    logits = random_logits(7, seed=23)
    next_tokens = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    lp = compute_token_logprobs(logits, next_tokens, 2)
    _check_logprobs(logits, next_tokens, lp, 2)
    only = compute_token_logprobs(logits, next_tokens, 0)
    assert only.token_ids.shape == (7, 1)


def test_ties_share_rank() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    lp = compute_token_logprobs(logits, torch.tensor([2]), 1)
    assert lp.ranks.tolist() == [1]
    assert compute_token_logprobs(logits, torch.tensor([3]), 0).ranks.tolist() == [4]


def test_bf16_logits_accepted() -> None:
    logits = random_logits(3, seed=30).bfloat16()
    out = run(logits, [row(GREEDY), row(SamplingParams(logprobs=2)), row(SamplingParams())])
    assert out.sampled_token_ids[0].item() == int(logits[0].float().argmax())
    assert out.logprobs.logprobs.dtype == torch.float32
