"""Triton paged-attention kernels, run by Triton's interpreter on CPU tensors against a dense
float64 PyTorch reference.

The kernels run from a private copy of their module built for the interpreter, whatever imported
triton before (tests/triton_interp.py says why that is needed).

Cache entries that no request may read (unused blocks, table padding, slots past seq_len and, in
the sliding-window tests, tiles wholly before the window) hold NaN: reading one poisons the output.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from triton_interp import interpreter_on, load_interpreted, on_device  # noqa: E402

tk = load_interpreted("_tram_triton_kernels_interpreted", "tram/model/attention/triton_kernels.py")


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    interpreter_on(monkeypatch)


FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {FP32: dict(atol=1e-5, rtol=1e-5), FP16: dict(atol=4e-3, rtol=4e-3), BF16: dict(atol=3e-2, rtol=3e-2)}


def test_kernels_run_in_the_interpreter():
    want = "JITFunction" if on_device() else "InterpretedFunction"  # compiled on a GPU, TRITON_INTERPRET=0
    assert type(tk._attention_kernel).__name__ == want


# ------------------------------------------------------------------------------------- helpers


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Batch:
    """A paged cache holding each request's context at random (non-contiguous) blocks, NaN elsewhere."""

    def __init__(
        self,
        reqs: list[tuple[int, int]],
        *,
        num_kv_heads: int,
        group: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        poison_before: list[int] | None = None,
    ) -> None:
        self.query_lens = [q for q, _ in reqs]
        self.seq_lens_list = [s for _, s in reqs]
        self.num_tokens = sum(self.query_lens)
        self.num_heads = num_kv_heads * group
        self.block_size, self.dtype = block_size, dtype
        blocks = [cdiv(s, block_size) for s in self.seq_lens_list]
        num_blocks = sum(blocks) + 3
        perm = torch.randperm(num_blocks)
        spare = int(perm[-1])  # never holds context: pads the tables
        self.kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
        self.block_tables = torch.full((len(reqs), max(blocks + [0]) + 2), spare, dtype=torch.int32)
        used = 0
        for i, (seq_len, n) in enumerate(zip(self.seq_lens_list, blocks)):
            ids = perm[used : used + n]
            used += n
            self.block_tables[i, :n] = ids.to(torch.int32)
            kv = torch.full((2, n * block_size, num_kv_heads, head_dim), float("nan"))
            kv[:, :seq_len] = torch.randn(2, seq_len, num_kv_heads, head_dim)
            if poison_before is not None:
                kv[:, : poison_before[i]] = float("nan")
            self.kv_cache[:, ids] = kv.view(2, n, block_size, num_kv_heads, head_dim).to(dtype)
        self.query_start_loc = torch.tensor([0] + self.query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        self.seq_lens = torch.tensor(self.seq_lens_list, dtype=torch.int32)
        # query and out are strided views, as when q/k/v are split out of one projection.
        qkv = torch.randn(self.num_tokens, (self.num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
        qkv[:, self.num_heads * head_dim :] = float("nan")  # past the query heads: never to be read
        self.query = qkv[:, : self.num_heads * head_dim].view(self.num_tokens, self.num_heads, head_dim)
        self.out = torch.full((self.num_tokens, self.num_heads + 1, head_dim), float("nan"), dtype=dtype)[:, 1:]
        self.scale = head_dim**-0.5

    def run(self, sliding_window: int | None = None, num_splits: int = 1, **overrides) -> torch.Tensor:
        tk.paged_attention(
            self.query,
            self.kv_cache,
            self.out,
            self.query_start_loc,
            self.seq_lens,
            self.block_tables,
            self.scale,
            num_reqs=len(self.query_lens),
            max_query_len=max(self.query_lens),
            sliding_window=sliding_window,
            num_splits=num_splits,
            **overrides,
        )
        return self.out

    def reference(self, sliding_window: int | None = None, soft_cap: float | None = None) -> torch.Tensor:
        return reference_attention(
            self.query,
            self.kv_cache,
            self.query_lens,
            self.seq_lens_list,
            self.block_tables,
            self.scale,
            sliding_window,
            soft_cap,
        )


def reference_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Dense float64 attention: each request's context gathered through its table, offset-causal mask;
    scores soft-capped (cap * tanh(score / cap), before the mask) when soft_cap is set."""
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    group = query.shape[1] // num_kv_heads
    out = torch.zeros(query.shape, dtype=torch.float64)
    start = 0
    for i, (q_len, seq_len) in enumerate(zip(query_lens, seq_lens)):
        if seq_len > 0:
            ids = block_tables[i, : cdiv(seq_len, block_size)].long()
            # nan_to_num: poisoned positions outside every window weigh 0 here (and NaN in the kernel).
            k, v = (
                kv_cache[j][ids].reshape(-1, num_kv_heads, head_dim)[:seq_len].double().nan_to_num() for j in (0, 1)
            )
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [S, Hq, D]
            q = query[start : start + q_len].double()
            scores = torch.einsum("qhd,khd->hqk", q, k) * scale
            if soft_cap is not None:
                scores = soft_cap * torch.tanh(scores / soft_cap)
            q_pos = torch.arange(seq_len - q_len, seq_len).view(-1, 1)
            k_pos = torch.arange(seq_len).view(1, -1)
            seen = k_pos <= q_pos
            if sliding_window is not None:
                seen &= k_pos > q_pos - sliding_window
            probs = scores.masked_fill(~seen, float("-inf")).softmax(-1)
            out[start : start + q_len] = torch.einsum("hqk,khd->qhd", probs, v)
        start += q_len
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual.double(), expected, **TOL[dtype])


# ------------------------------------------------------------------------------------ KV write


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("block_size,num_kv_heads,head_dim", [(16, 2, 16), (32, 3, 32), (16, 1, 64), (16, 2, 24)])
def test_write_kv_cache(dtype, block_size, num_kv_heads, head_dim):
    torch.manual_seed(0)
    num_blocks, num_tokens = 5, 19
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[0, 7, 18]] = -1  # padding tokens
    # Strided views, as when k and v are split out of one projection.
    kv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim).to(dtype)
    key = kv[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = kv[:, 2 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    expected = cache.clone()
    real = slots >= 0
    expected[0].view(-1, num_kv_heads, head_dim)[slots[real]] = key[real]
    expected[1].view(-1, num_kv_heads, head_dim)[slots[real]] = value[real]
    tk.write_kv_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)


# ----------------------------------------------------------------------------------- attention

# (query_len, seq_len): prefill without prefix, prefill chunks with a cached prefix, decodes
# (one of them a partial first block, one at a block boundary).
MIXED = [(7, 7), (5, 21), (1, 18), (1, 33), (1, 1), (3, 40), (1, 32)]


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize(
    "dtype,group,block_size,head_dim",
    [
        (FP32, 1, 16, 16),
        (FP32, 2, 32, 32),
        (FP32, 4, 16, 16),
        (BF16, 2, 16, 32),
        (FP16, 4, 32, 16),
        (FP16, 1, 16, 64),
        (FP32, 3, 16, 32),
        (FP32, 2, 16, 8),  # head_dims below 16 or not a power of two run in padded, masked tiles
        (BF16, 1, 32, 24),
    ],
)
def test_mixed_batch(num_splits, dtype, group, block_size, head_dim):
    torch.manual_seed(1)
    batch = Batch(MIXED, num_kv_heads=2, group=group, head_dim=head_dim, block_size=block_size, dtype=dtype)
    assert_close(batch.run(num_splits=num_splits), batch.reference(), dtype)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_result_independent_of_program_order(monkeypatch, num_splits):
    """On a GPU programs run in any order, concurrently: run them in reverse so that a row written
    by two programs (e.g. an overflow row of a tile when GROUP does not divide BLOCK_M) is caught."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_grid_idx = builder.set_grid_idx

    def reversed_grid_idx(x, y, z):
        nx, ny, nz = builder.grid_dim
        set_grid_idx(nx - 1 - x, ny - 1 - y, nz - 1 - z)

    monkeypatch.setattr(builder, "set_grid_idx", reversed_grid_idx)
    torch.manual_seed(9)
    batch = Batch(MIXED, num_kv_heads=2, group=3, head_dim=16, block_size=16, dtype=FP32)
    assert_close(batch.run(num_splits=num_splits), batch.reference(), FP32)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_decode_only(num_splits, group):
    torch.manual_seed(2)
    reqs = [(1, 77), (1, 5), (1, 16), (1, 50)]
    batch = Batch(reqs, num_kv_heads=1 if group == 8 else 2, group=group, head_dim=32, block_size=16, dtype=FP32)
    assert_close(batch.run(num_splits=num_splits), batch.reference(), FP32)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("window,dtype", [(1, FP32), (6, FP32), (16, BF16), (40, FP32)])
def test_sliding_window(num_splits, window, dtype):
    torch.manual_seed(3)
    reqs = [(1, 140), (6, 130), (9, 9), (1, 3), (4, 100)]
    # Tiles wholly before every window of a request must be skipped, not merely masked: poison
    # them (whole 64-position chunks, so this holds for any tile size up to 64).
    poison = [max(0, seq - q - window + 1) // 64 * 64 for q, seq in reqs]
    batch = Batch(reqs, num_kv_heads=2, group=2, head_dim=16, block_size=16, dtype=dtype, poison_before=poison)
    assert any(poison)
    assert_close(batch.run(sliding_window=window, num_splits=num_splits), batch.reference(window), dtype)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize(
    "dtype,group,window,soft_cap",
    [(FP32, 2, None, 0.5), (FP32, 1, 6, 5.0), (BF16, 2, None, 5.0), (FP16, 4, 16, 50.0)],
)
def test_soft_cap(num_splits, dtype, group, window, soft_cap):
    """Gemma 2's soft-capped scores over a mixed batch, from well inside the cap to far past it
    (query x 8), split or not, with and without a window."""
    torch.manual_seed(14)
    batch = Batch(MIXED, num_kv_heads=2, group=group, head_dim=16, block_size=16, dtype=dtype)
    batch.query.mul_(8)
    out = batch.run(sliding_window=window, num_splits=num_splits, logits_soft_cap=soft_cap)
    assert_close(out, batch.reference(window, soft_cap), dtype)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_long_prefill_chunk(num_splits):
    """max_query_len >= 64 switches to larger query tiles."""
    torch.manual_seed(4)
    reqs = [(70, 90), (1, 30), (66, 66)]
    batch = Batch(reqs, num_kv_heads=1, group=2, head_dim=16, block_size=32, dtype=FP32)
    assert_close(batch.run(num_splits=num_splits), batch.reference(), FP32)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_padding_requests_read_nothing_and_output_zeros(num_splits):
    torch.manual_seed(5)
    reqs = [(1, 20), (1, 0), (4, 9), (1, 0), (1, 0)]
    batch = Batch(reqs, num_kv_heads=2, group=2, head_dim=16, block_size=16, dtype=FP32)
    # A padding request's table points at garbage (NaN) blocks only: it must read none of them.
    assert (batch.block_tables[[1, 3, 4]] == int(batch.block_tables[0, -1])).all()
    out = batch.run(num_splits=num_splits)
    assert torch.equal(out[[1, 6, 7]], torch.zeros_like(out[[1, 6, 7]]))
    assert_close(out, batch.reference(), FP32)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_rows_past_the_last_request_are_untouched(num_splits):
    torch.manual_seed(6)
    batch = Batch([(2, 10), (1, 17)], num_kv_heads=1, group=4, head_dim=16, block_size=16, dtype=FP32)
    batch.query_start_loc[-1] = 2  # the last request is empty: its query row is no request's
    batch.query_lens[-1] = 0
    out = batch.run(num_splits=num_splits)
    assert torch.isnan(out[2]).all()
    assert_close(out[:2], batch.reference()[:2], FP32)


def test_grid_depends_on_host_ints_only(monkeypatch):
    """Same (T, num_reqs, max_query_len, num_splits) with other lengths and tables on the device:
    same launch grids (what CUDA-graph replay needs), still correct results."""
    grids = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            grids.append(grid)
            return self.kernel[grid]

    monkeypatch.setattr(tk, "_attention_kernel", Recorder(tk._attention_kernel))
    monkeypatch.setattr(tk, "_reduce_splits_kernel", Recorder(tk._reduce_splits_kernel))
    torch.manual_seed(7)
    for seq_lens in ([3, 40, 17], [61, 0, 2]):
        batch = Batch([(1, s) for s in seq_lens], num_kv_heads=2, group=2, head_dim=16, block_size=16, dtype=FP32)
        assert_close(batch.run(num_splits=2), batch.reference(), FP32)
    assert len(grids) == 4 and grids[:2] == grids[2:]


def test_write_then_attend():
    """The backend's order: the step's new K/V are written through slot_mapping, then attended."""
    torch.manual_seed(8)
    reqs = [(6, 6), (3, 20), (1, 12)]
    num_kv_heads, head_dim, block_size = 2, 16, 16
    batch = Batch(reqs, num_kv_heads=num_kv_heads, group=2, head_dim=head_dim, block_size=block_size, dtype=FP32)
    slots, expected = [], batch.kv_cache.clone()
    for i, (q_len, seq_len) in enumerate(reqs):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(batch.block_tables[i, pos // block_size]) * block_size + pos % block_size)
    slot_mapping = torch.tensor(slots + [-1])  # one padding token at the end
    key = torch.randn(batch.num_tokens + 1, num_kv_heads, head_dim)
    value = torch.randn(batch.num_tokens + 1, num_kv_heads, head_dim)
    batch.kv_cache[:, :, :, :, :] = float("nan")  # only the new tokens are written: the rest must stay unread
    for i, (q_len, seq_len) in enumerate(reqs):
        if q_len < seq_len:  # restore the cached prefixes
            for pos in range(seq_len - q_len):
                b, o = int(batch.block_tables[i, pos // block_size]), pos % block_size
                batch.kv_cache[:, b, o] = expected[:, b, o]
    tk.write_kv_cache(key, value, batch.kv_cache, slot_mapping)
    expected[0].view(-1, num_kv_heads, head_dim)[slot_mapping[:-1]] = key[:-1]
    expected[1].view(-1, num_kv_heads, head_dim)[slot_mapping[:-1]] = value[:-1]
    ref = reference_attention(
        batch.query, expected, batch.query_lens, batch.seq_lens_list, batch.block_tables, batch.scale, None
    )
    assert_close(batch.run(), ref, FP32)


# --------------------------------------------------------------------------------------- fp8 cache

FP8 = [pytest.param(torch.float8_e4m3fn, id="e4m3"), pytest.param(torch.float8_e5m2, id="e5m2")]


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_write_kv_cache_fp8_rounds_like_torch(fmt, dtype):
    """Saturated, scaled and rounded to nearest even, bit for bit as kv_quant.quantize_kv (torch's cast):
    ties, values past the format's range, subnormals, zeros."""
    from tram.model.attention.kv_quant import quantize_kv

    torch.manual_seed(12)
    num_tokens, num_kv_heads, head_dim = 40, 2, 16
    magnitudes = torch.logspace(-14, 18, num_tokens, base=2).view(-1, 1, 1)  # fp8 subnormals to past 448
    key = (torch.randn(num_tokens, num_kv_heads, head_dim) * magnitudes).to(dtype)
    key[0, 0, :6] = torch.tensor([1.0625, 1.1875, -17.0, 1e6, 0.0, -0.0]).to(dtype)  # ties, saturation, zeros
    value = (3 * torch.randn(num_tokens, num_kv_heads, head_dim)).to(dtype)
    cache = torch.zeros(2, 6, 16, num_kv_heads, head_dim, dtype=fmt)
    slots = torch.randperm(96)[:num_tokens]
    slots[5] = -1  # a padding token
    tk.write_kv_cache(key, value, cache, slots, 0.75, 2.0)
    real = slots >= 0
    for i, (x, scale) in enumerate(((key, 0.75), (value, 2.0))):
        stored = cache[i].view(-1, num_kv_heads, head_dim)[slots[real]]
        assert torch.equal(stored.view(torch.uint8), quantize_kv(x[real], fmt, scale).view(torch.uint8))


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(
    "fmt,dtype", [(torch.float8_e4m3fn, FP32), (torch.float8_e5m2, FP32), (torch.float8_e4m3fn, BF16)]
)
def test_attention_over_fp8_cache(num_splits, fmt, dtype):
    """Reads of an fp8 cache equal attention over the dequantized cache (stored * scale)."""
    from tram.model.attention.kv_quant import quantize_kv

    torch.manual_seed(13)
    batch = Batch(MIXED, num_kv_heads=2, group=2, head_dim=16, block_size=16, dtype=dtype)
    k_scale, v_scale = 0.5, 2.0
    batch.kv_cache = torch.stack(
        [quantize_kv(batch.kv_cache[0], fmt, k_scale), quantize_kv(batch.kv_cache[1], fmt, v_scale)]
    )  # NaN poison stays NaN
    dequantized = torch.stack([batch.kv_cache[0].float() * k_scale, batch.kv_cache[1].float() * v_scale])
    out = batch.run(num_splits=num_splits, k_scale=k_scale, v_scale=v_scale)
    ref = reference_attention(
        batch.query, dequantized, batch.query_lens, batch.seq_lens_list, batch.block_tables, batch.scale, None
    )
    assert_close(out, ref, dtype)


# The interpreter cannot see what only the compiler checks (types of loop-carried values, constexpr
# branches, dot shapes...): compile, without running, every kernel launch of a few configurations
# for sm_90, with the arguments the public functions pass. It needs no GPU (ptxas ships with triton).
_COMPILE_SCRIPT = r'''
import os
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
import tram.model.attention.triton_kernels as tk

launches = []

class Capture:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))

for name in ("_attention_kernel", "_reduce_splits_kernel", "_write_kv_kernel"):
    setattr(tk, name, Capture(getattr(tk, name)))

TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64",
         torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}

def compile_launch(kernel, args, kwargs):
    """What triton's launcher would compile: ints equal to 1 and None/bools become constants."""
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    bound = dict(zip(kernel.arg_names, args), **kwargs)
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        v = bound[name]
        if i in kernel.constexprs or v is None or isinstance(v, (bool, str)) or (isinstance(v, int) and v == 1):
            sig[name], constexprs[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TYPES[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32" if -2**31 <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

for dtype, head_dim, group, max_q, window, splits, cache_dtype in [
    (torch.float16, 128, 4, 1, None, 1, None), (torch.bfloat16, 128, 1, 100, 64, 4, None),
    (torch.float32, 64, 2, 3, None, 2, None), (torch.float16, 256, 8, 80, None, 1, None),
    (torch.float16, 80, 4, 1, None, 3, None), (torch.float32, 8, 1, 20, None, 1, None),
    (torch.bfloat16, 128, 4, 1, None, 1, torch.float8_e4m3fn), (torch.float16, 64, 2, 40, None, 3, torch.float8_e5m2),
]:
    softcap = 50.0 if (dtype, head_dim) == (torch.bfloat16, 128) else None  # Gemma 2's, on two of them
    T, hkv, bs = max_q + 2, 2, 16
    sinks = torch.zeros(hkv * group) if head_dim in (64, 80) else None  # gpt-oss's, split and not
    q = torch.empty(T, hkv * group, head_dim, dtype=dtype)
    cache = torch.empty(2, 40, bs, hkv, head_dim, dtype=cache_dtype or dtype)
    qsl = torch.tensor([0, max_q, max_q + 1, T], dtype=torch.int32)
    tk.write_kv_cache(q[:, :hkv], q[:, :hkv], cache, torch.zeros(T, dtype=torch.int64), 0.5, 2.0)
    tk.paged_attention(q, cache, torch.empty_like(q), qsl, torch.zeros(3, dtype=torch.int32),
                       torch.zeros(3, 8, dtype=torch.int32), 0.1, num_reqs=3, max_query_len=max_q,
                       sliding_window=window, num_splits=splits, k_scale=0.5, v_scale=2.0,
                       logits_soft_cap=softcap, sinks=sinks)
for launch in launches:
    compile_launch(*launch)
print("compiled", len(launches))
'''


def test_kernels_compile_for_sm90():
    import subprocess

    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this triton has no ASTSource/GPUTarget")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "compiled 20" in result.stdout
