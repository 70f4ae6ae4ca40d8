"""The C++ CPU prefill attention kernel (tram/model/kernels/csrc/paged_prefill.cpp) against a float64
reference, its invariances (chunking, cached prefix, batch, threads), its checks, and its routing
in the PyTorch attention backend."""

from __future__ import annotations

import random

import pytest
import torch
from hf_models import StepRequest, build_meta

from tram.model.attention import torch_backend
from tram.model.kernels.cpu_kernels import load_cpu_kernels, paged_prefill_attention_

TOLERANCES = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
NUM_BLOCKS = 160


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build (see the warning log)"


class Case:
    """Requests (query_len, seq_len) over a shuffled paged cache; rows packed in request order."""

    def __init__(
        self,
        reqs: list[tuple[int, int]],
        heads: int,
        kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.reqs, self.block_size = reqs, block_size
        self.cache = torch.randn(2, NUM_BLOCKS, block_size, kv_heads, head_dim, generator=gen).to(dtype)
        self.query = torch.randn(sum(q for q, _ in reqs), heads, head_dim, generator=gen).to(dtype)
        width = max(-(-s // block_size) for _, s in reqs)
        perm = torch.randperm(NUM_BLOCKS, generator=gen).to(torch.int32)
        self.tables = torch.zeros(len(reqs), width, dtype=torch.int32)
        used = 0
        for r, (_, seq_len) in enumerate(reqs):
            n = -(-seq_len // block_size)
            self.tables[r, :n] = perm[used : used + n]
            used += n
        assert used <= NUM_BLOCKS
        self.starts = [sum(q for q, _ in reqs[:r]) for r in range(len(reqs))]
        self.scale = head_dim**-0.5

    def run(self, window: int = 0, query: torch.Tensor | None = None, soft_cap: float | None = None) -> torch.Tensor:
        query = self.query if query is None else query
        out = torch.full(query.shape, float("nan"), dtype=query.dtype)
        paged_prefill_attention_(
            out,
            query,
            self.cache,
            self.tables,
            self.starts,
            [q for q, _ in self.reqs],
            [s for _, s in self.reqs],
            self.scale,
            window,
            logits_soft_cap=soft_cap,
        )
        return out

    def context(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = self.reqs[r][1]
        blocks = self.tables[r, : -(-seq_len // self.block_size)].long()
        kv = self.cache[:, blocks].flatten(1, 2)[:, :seq_len]  # [2, seq_len, Hkv, D]
        return kv[0], kv[1]

    def reference(self, r: int, window: int = 0, soft_cap: float | None = None) -> torch.Tensor:
        q_len, seq_len = self.reqs[r]
        q = self.query[self.starts[r] : self.starts[r] + q_len].double().transpose(0, 1)  # [H, L, D]
        k, v = (t.double().transpose(0, 1) for t in self.context(r))  # [Hkv, S, D]
        groups = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        q_pos = torch.arange(seq_len - q_len, seq_len).view(-1, 1)
        k_pos = torch.arange(seq_len).view(1, -1)
        visible = k_pos <= q_pos
        if window:
            visible &= k_pos > q_pos - window
        scores = q @ k.transpose(1, 2) * self.scale
        if soft_cap is not None:  # transformers' order: cap, then mask
            scores = soft_cap * torch.tanh(scores / soft_cap)
        scores = scores.masked_fill(~visible, float("-inf"))
        return (scores.softmax(-1) @ v).transpose(0, 1)  # [L, H, D]

    def check(self, window: int = 0, soft_cap: float | None = None) -> torch.Tensor:
        out = self.run(window, soft_cap=soft_cap)
        atol, rtol = TOLERANCES[self.query.dtype]
        for r, (q_len, _) in enumerate(self.reqs):
            got = out[self.starts[r] : self.starts[r] + q_len]
            torch.testing.assert_close(got.double(), self.reference(r, window, soft_cap), atol=atol, rtol=rtol)
        return out


def random_reqs(n: int, seed: int, longest: int = 300, prefix: bool = True) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        q_len = rng.randint(2, longest)
        reqs.append((q_len, q_len + (rng.choice([0, rng.randint(1, 200)]) if prefix else 0)))
    return reqs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(6, 6, 48), (4, 2, 16), (8, 1, 64), (14, 2, 32)])
def test_matches_reference(dtype, heads, kv_heads, head_dim, threads) -> None:
    Case(random_reqs(3, seed=head_dim + heads), heads, kv_heads, head_dim, 16, dtype, seed=1).check()


@pytest.mark.parametrize("window", [1, 7, 16, 100, 1000])
def test_sliding_window(window) -> None:
    Case(random_reqs(3, seed=window), 4, 2, 32, 16, torch.float32, seed=2).check(window)


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_other_block_sizes(block_size) -> None:
    Case([(40, 90), (17, 17)], 4, 2, 16, block_size, torch.float32, seed=3).check()


def test_long_context_crosses_segments() -> None:
    """Past 256 keys the online softmax rescales earlier segments; large scores must not overflow."""
    case = Case([(600, 700), (2, 520)], 4, 2, 16, 16, torch.float32, seed=4)
    case.query *= 8  # scores in the hundreds
    case.check()


@pytest.mark.parametrize("soft_cap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [0, 23])
def test_soft_cap(soft_cap, dtype, window) -> None:
    """Gemma 2's soft-capped scores (query x 8: from well inside the cap to far past it), across
    segments (keys past 256) and with a cached prefix."""
    case = Case([(40, 300), (9, 9), (70, 100)], 4, 2, 32, 16, dtype, seed=9)
    case.query *= 8
    case.check(window, soft_cap)


def test_soft_cap_off_is_the_uncapped_kernel() -> None:
    """None and 0 mean no cap: bitwise the uncapped result."""
    case = Case(random_reqs(3, seed=10), 4, 2, 32, 16, torch.float32, seed=10)
    plain = case.run()
    for off in (None, 0.0):
        assert torch.equal(case.run(soft_cap=off), plain)


def test_strided_query_and_untouched_rows() -> None:
    case = Case([(30, 30), (9, 40)], 4, 2, 16, 16, torch.float32, seed=5)
    wide = torch.randn(case.query.shape[0] + 7, 4, 48)
    wide[: case.query.shape[0], :, 8:24] = case.query
    strided = wide[: case.query.shape[0], :, 8:24]  # strides (192, 48, 1), not contiguous
    torch.testing.assert_close(case.run(query=strided), case.run(), atol=0, rtol=0)
    # Rows that belong to no request (decodes, padding) are left as they were.
    out = torch.full((50, 4, 16), 7.0)
    paged_prefill_attention_(out, torch.randn(50, 4, 16), case.cache, case.tables[:1], [10], [30], [30], 0.25)
    assert torch.equal(out[:10], torch.full((10, 4, 16), 7.0)) and torch.equal(out[40:], torch.full((10, 4, 16), 7.0))


@pytest.mark.parametrize(
    "dtype,window,soft_cap",
    [
        pytest.param(dtype, window, None, id=f"{name}-{window}")
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
        for window in (0, 37)
    ]
    + [pytest.param(torch.float32, 37, 5.0, id="fp32-37-softcap")],
)
def test_chunking_and_cached_prefix_do_not_change_a_row(dtype, window, soft_cap) -> None:
    """A prompt computed whole, or in chunks over the cache the earlier chunks filled, gives bitwise
    the same rows: chunked prefill and prefix caching never change a request's output."""
    seq_len = 530
    whole = Case([(seq_len, seq_len)], 6, 2, 48, 16, dtype, seed=6)
    full = whole.run(window, soft_cap=soft_cap)
    for cuts in ([100, 300], [1, 256, 257], [63, 64, 65, 500]):
        bounds = [0, *cuts, seq_len]
        for a, b in zip(bounds, bounds[1:]):
            out = torch.empty(b - a, 6, 48, dtype=dtype)
            rows = (whole.query[a:b], whole.cache, whole.tables, [0], [b - a], [b], whole.scale, window)
            paged_prefill_attention_(out, *rows, logits_soft_cap=soft_cap)
            torch.testing.assert_close(out, full[a:b], atol=0, rtol=0, msg=f"rows {a}:{b} of cuts {cuts}")


def test_batch_and_thread_invariant() -> None:
    case = Case(random_reqs(5, seed=7), 8, 2, 64, 16, torch.bfloat16, seed=7)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = case.run()
        torch.set_num_threads(2)
        two = case.run()
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(one, two, atol=0, rtol=0)
    r = 3  # the same request alone
    q_len, seq_len = case.reqs[r]
    rows = slice(case.starts[r], case.starts[r] + q_len)
    alone = torch.empty(q_len, 8, 64, dtype=torch.bfloat16)
    paged_prefill_attention_(
        alone, case.query[rows], case.cache, case.tables[r : r + 1], [0], [q_len], [seq_len], case.scale
    )
    torch.testing.assert_close(alone, two[rows], atol=0, rtol=0)


def test_rejects_bad_inputs() -> None:
    case = Case([(20, 40)], 4, 2, 16, 16, torch.float32)
    out = torch.empty_like(case.query)
    args = (case.cache, case.tables, [0], [20], [40], 0.25)
    bad = case.tables.clone()
    bad[0, 1] = NUM_BLOCKS
    with pytest.raises(RuntimeError, match="out of range"):
        paged_prefill_attention_(out, case.query, case.cache, bad, [0], [20], [40], 0.25)
    with pytest.raises(RuntimeError, match="do not fit"):
        paged_prefill_attention_(out, case.query, case.cache, case.tables, [0], [20], [10_000], 0.25)
    with pytest.raises(RuntimeError, match="do not fit"):
        paged_prefill_attention_(out, case.query, case.cache, case.tables, [5], [20], [40], 0.25)
    with pytest.raises(RuntimeError, match="one dtype"):
        paged_prefill_attention_(out.bfloat16(), case.query.bfloat16(), *args)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        paged_prefill_attention_(out[..., :8].contiguous(), case.query[..., :8], *args)
    with pytest.raises(RuntimeError, match="one entry per"):
        paged_prefill_attention_(out, case.query, case.cache, case.tables, [0, 0], [20], [40], 0.25)
    with pytest.raises(RuntimeError, match="logits_soft_cap"):
        paged_prefill_attention_(out, case.query, *args, logits_soft_cap=-1.0)


@pytest.mark.parametrize("head_dim,expected", [(16, 1), (8, 0)])
def test_backend_routes_prefills_to_the_kernel(monkeypatch: pytest.MonkeyPatch, head_dim, expected) -> None:
    """A mixed step (a decode between two prefills, one with a cached prefix) through the backend:
    the kernel takes every prefill at once when head_dim allows, and agrees with the SDPA path."""
    calls = []
    real = torch_backend.paged_prefill_attention_
    monkeypatch.setattr(torch_backend, "paged_prefill_attention_", lambda *a: calls.append(1) or real(*a))
    reqs = [StepRequest([0, 1, 2], 0, 20), StepRequest([3, 4, 5], 30, 1), StepRequest([6, 7, 8], 9, 12)]
    meta = build_meta(reqs, 16)
    gen = torch.Generator().manual_seed(8)
    t = meta.num_tokens
    q, k, v = (torch.randn(t, n, head_dim, generator=gen) for n in (4, 2, 2))
    cache = torch.randn(2, 16, 16, 2, head_dim, generator=gen)
    with torch.inference_mode():  # as the model runner calls it; C++ kernels never run under autograd
        got = torch_backend.TorchAttentionBackend().forward(q, k, v, cache.clone(), meta, 0.3)
        assert len(calls) == expected
        monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
        want = torch_backend.TorchAttentionBackend().forward(q, k, v, cache.clone(), meta, 0.3)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_backend_soft_cap_paths_agree(monkeypatch: pytest.MonkeyPatch, window) -> None:
    """A soft-capped mixed step (decodes, a prefill without and one with a cached prefix) through the
    backend: the C++ kernels and the PyTorch paths (SDPA has no soft-cap: the explicit scores path)
    give one result, and the cap changes it."""
    reqs = [StepRequest([0, 1], 0, 20), StepRequest([3, 4, 5], 30, 1), StepRequest([6, 7], 9, 12)]
    reqs.append(StepRequest([9, 10], 17, 1))
    meta = build_meta(reqs, 16)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(meta.num_tokens, n, 16, generator=gen) for n in (4, 2, 2))
    cache = torch.randn(2, 16, 16, 2, 16, generator=gen)

    def attend(cap: float | None) -> torch.Tensor:
        meta.plan = None  # a fresh plan for each run, as each step gets
        backend = torch_backend.TorchAttentionBackend()
        return backend.forward(q, k, v, cache.clone(), meta, 0.5, window, logits_soft_cap=cap)

    with torch.inference_mode():
        kernels, uncapped = attend(1.5), attend(None)
        monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
        monkeypatch.setattr(torch_backend, "load_cpu_kernels", lambda: None)
        torch_paths = attend(1.5)
    torch.testing.assert_close(kernels, torch_paths, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(kernels, uncapped, atol=1e-3)
