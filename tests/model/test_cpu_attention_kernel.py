"""The C++ paged decode attention kernel (tram/model/kernels/csrc/paged_decode.cpp) against a
float64 reference that gathers each request's context position by position.

Every cache slot a request may not read (past its seq_len, before its sliding window, in blocks its
table lists but does not use, in blocks nobody owns) holds NaN or a huge value, so reading any of
them would show in the output. The kernel must build here: a failed build fails these tests.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tram.model.kernels import cpu_kernels
from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels, paged_decode_attention

TOLERANCES = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert load_cpu_kernels() is not None, "the CPU attention kernel failed to build (see the warning log)"


def context_slots(table: torch.Tensor, start: int, end: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids, offsets) of positions start .. end - 1 under one block table row."""
    t = torch.arange(start, end)
    return table[t // block_size].long(), t % block_size


def make_case(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    sliding_window: int | None = None,
    seed: int = 0,
    poison: float = math.nan,
    spare_table_cols: int = 2,
):
    """Random query/cache/tables; every slot outside a request's attended span is `poison`."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    width = max(blocks_needed + [1]) + spare_table_cols
    num_blocks = sum(blocks_needed) + 8  # 8 blocks nobody owns
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    owned, garbage = ids[: sum(blocks_needed)], ids[sum(blocks_needed) :]
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), poison, dtype=dtype)
    tables = torch.empty(len(seq_lens), width, dtype=torch.int32)
    pos = 0
    for i, (n, nb) in enumerate(zip(seq_lens, blocks_needed)):
        row = owned[pos : pos + nb] + [rng.choice(garbage) for _ in range(width - nb)]
        pos += nb
        tables[i] = torch.tensor(row, dtype=torch.int32)
        start = max(0, n - sliding_window) if sliding_window else 0
        blk, off = context_slots(tables[i], start, n, block_size)
        cache[:, blk, off] = torch.randn(2, n - start, num_kv_heads, head_dim, generator=gen).to(dtype)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype)
    return query, cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


def reference(
    query: torch.Tensor,
    cache: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Float64, one request at a time, context gathered token by token; scores soft-capped
    (cap * tanh(score / cap)) when soft_cap is set."""
    num_heads, head_dim = query.shape[1:]
    block_size, num_kv_heads = cache.shape[2], cache.shape[3]
    groups = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    for i, n in enumerate(seq_lens.tolist()):
        start = max(0, n - sliding_window) if sliding_window else 0
        blk, off = context_slots(tables[i], start, n, block_size)
        k, v = cache[0, blk, off].double(), cache[1, blk, off].double()  # [S, Hkv, D]
        k = k.repeat_interleave(groups, dim=1).transpose(0, 1)  # [H, S, D]
        v = v.repeat_interleave(groups, dim=1).transpose(0, 1)
        q = query[i].double().unsqueeze(1)  # [H, 1, D]
        scores = (q @ k.transpose(1, 2)) * scale
        if soft_cap is not None:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        out[i] = (torch.softmax(scores, dim=-1) @ v).squeeze(1)
    return out


def check(query, cache, tables, seq_lens, scale, sliding_window=None, soft_cap=None) -> torch.Tensor:
    out = paged_decode_attention(query, cache, tables, seq_lens, scale, sliding_window, logits_soft_cap=soft_cap)
    assert out.shape == query.shape and out.dtype == query.dtype and out.is_contiguous()
    ref = reference(query, cache, tables, seq_lens, scale, sliding_window, soft_cap)
    atol, rtol = TOLERANCES[query.dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
    return out


BLOCK = 16
EDGE_LENS = [1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 300]


def batch_lens(batch: int, seed: int, longest: int = 300) -> list[int]:
    rng = random.Random(seed)
    lens = EDGE_LENS + [rng.randint(1, longest) for _ in range(max(0, batch - len(EDGE_LENS)))]
    rng.shuffle(lens)
    return lens[:batch]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads", [(8, 2), (6, 6)], ids=["gqa8x2", "mha6"])
@pytest.mark.parametrize("head_dim", [8, 48, 64, 128])
def test_matches_reference(dtype, heads, head_dim, threads) -> None:
    num_heads, num_kv_heads = heads
    lens = batch_lens(37, seed=head_dim)
    case = make_case(lens, num_heads, num_kv_heads, head_dim, BLOCK, dtype, seed=head_dim + num_heads)
    check(*case, scale=head_dim**-0.5)


@pytest.mark.parametrize("seq_len", [1, BLOCK - 1, BLOCK, BLOCK + 1, 451])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_single_request(seq_len, dtype, threads) -> None:
    case = make_case([seq_len], 8, 2, 48, BLOCK, dtype, seed=seq_len, poison=1e30)
    check(*case, scale=48**-0.5)


@pytest.mark.parametrize("window", [1, 5, BLOCK, BLOCK + 3, 100, 10_000])
@pytest.mark.parametrize("heads", [(8, 2), (6, 6)], ids=["gqa8x2", "mha6"])
def test_sliding_window(window, heads, threads) -> None:
    lens = batch_lens(37, seed=window)
    case = make_case(lens, *heads, 32, BLOCK, torch.float32, sliding_window=window, seed=window)
    check(*case, scale=32**-0.5, sliding_window=window)


def test_sliding_window_bf16_long() -> None:
    lens = [700, 1, 33, 129, 512]
    case = make_case(lens, 8, 2, 64, BLOCK, torch.bfloat16, sliding_window=128, seed=3)
    check(*case, scale=64**-0.5, sliding_window=128)


@pytest.mark.parametrize("block_size", [1, 3, 32])
def test_other_block_sizes(block_size, threads) -> None:
    lens = [1, block_size, block_size + 1, 97, 5]
    case = make_case(lens, 4, 2, 16, block_size, torch.float32, seed=block_size)
    check(*case, scale=0.25)


def test_float16() -> None:
    case = make_case(batch_lens(12, seed=5), 8, 2, 64, BLOCK, torch.float16, seed=5)
    check(*case, scale=64**-0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [4, 12, 32, 40, 80, 96, 256])
def test_other_head_dims(head_dim, dtype) -> None:
    """Compiled-in sizes (32, 80, 96), run-time multiples of 8 (40, 256) and the scalar path (4, 12)."""
    case = make_case([1, 9, BLOCK + 1, 70], 4, 2, head_dim, BLOCK, dtype, seed=head_dim)
    check(*case, scale=head_dim**-0.5)


def test_large_scores_are_stable() -> None:
    """Scores in the hundreds: a naive exp would overflow."""
    query, cache, tables, seq_lens = make_case(batch_lens(10, seed=9), 6, 6, 48, BLOCK, torch.float32, seed=9)
    out = check(query * 30, cache, tables, seq_lens, scale=1.0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("soft_cap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [12, 64])
def test_soft_cap(soft_cap, dtype, head_dim) -> None:
    """Gemma 2's soft-capped scores, with scores from well inside the cap to far past it (query x 8),
    on the vector (64) and scalar (12) paths, with and without a window."""
    query, cache, tables, seq_lens = make_case(batch_lens(12, seed=21), 8, 2, head_dim, BLOCK, dtype, seed=21)
    check(query * 8, cache, tables, seq_lens, scale=head_dim**-0.5, soft_cap=soft_cap)
    query, cache, tables, seq_lens = make_case(
        batch_lens(12, seed=22), 8, 2, head_dim, BLOCK, dtype, sliding_window=20, seed=22
    )
    check(query * 8, cache, tables, seq_lens, scale=head_dim**-0.5, sliding_window=20, soft_cap=soft_cap)


def test_soft_cap_off_is_the_uncapped_kernel() -> None:
    """None and 0 mean no cap: bitwise the uncapped result; a cap far above every score changes
    nothing beyond rounding."""
    case = make_case(batch_lens(12, seed=23), 8, 2, 64, BLOCK, torch.float32, seed=23)
    plain = paged_decode_attention(*case, 0.125)
    for off in (None, 0.0):
        assert torch.equal(paged_decode_attention(*case, 0.125, logits_soft_cap=off), plain)
    torch.testing.assert_close(paged_decode_attention(*case, 0.125, logits_soft_cap=1e6), plain)


def test_strided_inputs(threads) -> None:
    """Query a slice of a wider tensor, tables a column slice of wider rows, int64 tables and lens."""
    lens = batch_lens(9, seed=11)
    query, cache, tables, seq_lens = make_case(lens, 8, 2, 32, BLOCK, torch.bfloat16, seed=11, spare_table_cols=5)
    wide = torch.randn(9, 3, 8, 32).to(torch.bfloat16)
    wide[:, 1] = query
    strided_query = wide[:, 1]  # rows 3 * 8 * 32 apart
    assert not strided_query.is_contiguous()
    narrow = tables[:, : -(-max(lens) // BLOCK)]  # like meta.block_tables[rows, :num_blocks]
    assert not narrow.is_contiguous()
    out = check(strided_query, cache, narrow, seq_lens.long(), scale=0.2)
    out2 = paged_decode_attention(query, cache, narrow.long(), seq_lens, 0.2)
    torch.testing.assert_close(out, out2, atol=0, rtol=0)
    # Transposed head/dim axes (head_dim not unit-stride).
    q_t = query.transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(paged_decode_attention(q_t, cache, tables, seq_lens, 0.2), out, atol=0, rtol=0)


def test_shared_blocks() -> None:
    """Requests sharing prefix blocks (prefix caching) read the same block ids."""
    query, cache, tables, seq_lens = make_case([40, 40, 40], 4, 4, 16, BLOCK, torch.float32, seed=2)
    tables[1, :2] = tables[0, :2]  # first 32 tokens shared with request 0
    tables[2, :1] = tables[0, :1]
    check(query, cache, tables, seq_lens, scale=0.25)


def test_deterministic_across_threads() -> None:
    case = make_case(batch_lens(37, seed=4), 8, 2, 64, BLOCK, torch.float32, seed=4)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = paged_decode_attention(*case, scale=0.125)
        torch.set_num_threads(2)
        two = paged_decode_attention(*case, scale=0.125)
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(one, two, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_batch_invariant(dtype) -> None:
    """A request's output is bitwise the same alone, in a small batch and in a large one."""
    query, cache, tables, seq_lens = make_case(batch_lens(37, seed=6), 8, 2, 64, BLOCK, dtype, seed=6)
    full = paged_decode_attention(query, cache, tables, seq_lens, 0.125)
    for rows in ([5], [0, 5, 36], list(range(3, 9))):
        part = paged_decode_attention(query[rows], cache, tables[rows], seq_lens[rows], 0.125)
        torch.testing.assert_close(part, full[rows], atol=0, rtol=0)


def test_empty_batch_and_empty_context() -> None:
    query, cache, tables, seq_lens = make_case([5], 2, 1, 8, BLOCK, torch.float32)
    empty = paged_decode_attention(query[:0], cache, tables[:0], seq_lens[:0], 1.0)
    assert empty.shape == (0, 2, 8)
    zero = paged_decode_attention(query, cache, tables, torch.zeros(1, dtype=torch.int32), 1.0)
    assert torch.equal(zero, torch.zeros_like(zero))


def test_rejects_bad_inputs() -> None:
    query, cache, tables, seq_lens = make_case([20, 3], 4, 2, 8, BLOCK, torch.float32)
    bad = tables.clone()
    bad[0, 1] = cache.shape[1]  # out of range block id
    with pytest.raises(RuntimeError, match="out of range"):
        paged_decode_attention(query, cache, bad, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="does not fit"):
        paged_decode_attention(query, cache, tables, torch.tensor([10_000, 3], dtype=torch.int32), 1.0)
    with pytest.raises(RuntimeError, match="dtype"):
        paged_decode_attention(query.bfloat16(), cache, tables, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="multiple"):
        paged_decode_attention(query[:, :3], cache, tables, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="logits_soft_cap"):
        paged_decode_attention(query, cache, tables, seq_lens, 1.0, logits_soft_cap=-1.0)


def test_env_switch_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernels.ENV_SWITCH, "0")
    cpu_kernels._reset_for_tests()
    try:
        assert load_cpu_kernels() is None and not cpu_kernels_available()
        with pytest.raises(RuntimeError, match="not available"):
            paged_decode_attention(*make_case([3], 2, 1, 8, BLOCK, torch.float32), 1.0)
    finally:
        monkeypatch.delenv(cpu_kernels.ENV_SWITCH)
        cpu_kernels._reset_for_tests()
    assert cpu_kernels_available()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 5, 700])  # 700: copies split over threads
def test_writing_kv_in_one_call_is_pytorchs_scatter(dtype: torch.dtype, tokens: int, monkeypatch):
    """torch_backend.write_kv_cache on the C++ kernel (write_kv_cache_) against its PyTorch scatter; a
    padding token's slot (-1) is skipped, where the scatter would write the cache's last slot."""
    from tram.model.attention import torch_backend

    g = torch.Generator().manual_seed(tokens)
    blocks, block_size, heads, dim = 64, 16, 2, 32
    key = torch.randn(tokens, heads, dim, generator=g).to(dtype)
    value = torch.randn(tokens, heads, dim, generator=g).to(dtype)
    slots = torch.randperm(blocks * block_size - 1, generator=g)[:tokens]
    if tokens > 1:
        slots[tokens // 2] = -1
    start = torch.randn(2, blocks, block_size, heads, dim, generator=g).to(dtype)
    got = start.clone()
    with torch.inference_mode():
        torch_backend.write_kv_cache(key, value, got, slots)
    want = start.clone()
    kept = slots >= 0
    monkeypatch.setattr(torch_backend, "kernels_for", lambda x: None)
    with torch.inference_mode():
        torch_backend.write_kv_cache(key[kept], value[kept], want, slots[kept])
    assert torch.equal(got, want) and not torch.equal(got, start)
    with pytest.raises(RuntimeError, match="past the cache"):
        load_cpu_kernels().write_kv_cache_(got, key, value, torch.full((tokens,), blocks * block_size))
    with pytest.raises(RuntimeError, match="dtype"):
        load_cpu_kernels().write_kv_cache_(got.float() if dtype != torch.float32 else got.half(), key, value, slots)
