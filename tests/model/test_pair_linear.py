"""bfloat16 linears on weights packed in pairs of k (csrc/pair_linear.cpp) and the LM head that takes
them (cpu_packed.pack_few_rows), and the layers' pairs copies beside oneDNN's for a decode step's rows.

pair_linear must give the float64 product within bfloat16 rounding for any row count (one pass of 16
rows, a partial one, several), odd K and N past a block of 16, with bias; every output must be the
same bits whatever the rows beside it and the thread count; a bad packed weight is refused. Where the
build has no AVX512-BF16 the kernel tests skip, and the LM head must keep oneDNN's layout."""

from __future__ import annotations

import pytest
import torch

from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels
from tram.model.layers.cpu_packed import (
    PAIR_ROWS,
    DecodePairs,
    PairPacked,
    pack_cpu_linears,
    pack_few_rows,
    packed_linear,
)
from tram.model.layers.embedding import LMHead, VocabEmbedding
from tram.model.layers.linear import Linear
from tram.model.layers.mlp import GatedMLP

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ CPU kernels did not build")


@pytest.fixture
def kernels():
    module = load_cpu_kernels()
    if not module.pair_linear_built():
        pytest.skip("this build has no AVX512-BF16: pair_linear is not built")
    return module


def make(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(m, k, generator=g).bfloat16(),
        torch.randn(n, k, generator=g).bfloat16(),
        torch.randn(n, generator=g).bfloat16(),
    )


def test_pack_layout(kernels) -> None:
    _, w, _ = make(1, 37, 9)
    packed = kernels.pair_pack(w)
    assert packed.shape == (3, 5, 16) and packed.dtype == torch.int32
    pairs = packed.view(torch.bfloat16).view(3, 5, 16, 2)  # the first of a pair in the low half
    wide = torch.zeros(48, 10, dtype=torch.bfloat16)
    wide[:37, :9] = w
    assert torch.equal(pairs.permute(0, 2, 1, 3).reshape(48, 10), wide)  # zeros past N and K


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("n, k", [(37, 67), (160, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(kernels, rows: int, n: int, k: int, bias: bool) -> None:
    x, w, b = make(rows, n, k, seed=rows + n)
    y = kernels.pair_linear(x, kernels.pair_pack(w), n, b if bias else None)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    # float32 sums rounded once to bfloat16: within a bf16 step of the exact product
    err = ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < 1e-2, err


def test_rows_and_threads_do_not_change_an_output(kernels) -> None:
    x, w, b = make(40, 70, 130, seed=5)
    packed = kernels.pair_pack(w)
    full = kernels.pair_linear(x, packed, 70, b)
    for lo, hi in [(0, 1), (7, 8), (3, 20), (16, 40), (39, 40)]:
        assert torch.equal(kernels.pair_linear(x[lo:hi], packed, 70, b), full[lo:hi])
    assert torch.equal(kernels.pair_linear(x[:, :130], packed, 70, b), full)  # strided x: the same
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernels.pair_linear(x, packed, 70, b), full)
    finally:
        torch.set_num_threads(threads)


def test_bad_packed_weight_is_refused(kernels) -> None:
    x, w, _ = make(2, 37, 64)
    with pytest.raises(RuntimeError, match="is not a packed"):
        kernels.pair_linear(x, kernels.pair_pack(w), 60, None)  # four blocks of 16, not three
    with pytest.raises(RuntimeError, match="pair_pack"):
        kernels.pair_linear(x, w, 37, None)  # the plain weight
    with pytest.raises(RuntimeError, match="bfloat16"):
        kernels.pair_linear(x.float(), kernels.pair_pack(w), 37, None)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_lm_head_packs_in_pairs_where_preferred(tied: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = VocabEmbedding(50, 32, torch.bfloat16)
    model.lm_head = LMHead(32, 50, torch.bfloat16, tied=tied)
    if not tied:
        torch.nn.init.normal_(model.lm_head.weight)
    model.eval().requires_grad_(False)
    assert pack_cpu_linears(model) == 1
    preferred = load_cpu_kernels().pair_linear_preferred()
    assert isinstance(model.lm_head.packed_weight, PairPacked) == preferred
    head = model.model.embed_tokens.weight if tied else model.lm_head.weight
    for rows in (1, 2, 19):
        hidden = torch.randn(rows, 32).bfloat16()
        with torch.inference_mode():
            logits = model.lm_head(hidden, model.model.embed_tokens)
        ref = hidden.double() @ head.double().T
        assert logits.dtype == torch.float32
        assert ((logits.double() - ref).abs() / (ref.abs() + 1)).max().item() < 1e-2


def test_float32_and_other_shapes_keep_onednn() -> None:
    assert not isinstance(pack_few_rows(torch.zeros(32, 16)), PairPacked)


def test_switch_off_keeps_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAM_CPU_PAIR_LINEAR", "0")
    packed = pack_few_rows(torch.zeros(32, 16, dtype=torch.bfloat16))
    assert not isinstance(packed, PairPacked)


def _layers() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.proj = Linear(64, 40, bias=True, dtype=torch.bfloat16)
    model.mlp = GatedMLP(64, 48, "silu", bias=False, dtype=torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return model.eval().requires_grad_(False)


def test_decode_rows_take_the_pairs_copy_beside_onednns() -> None:
    """A layer's bf16 weight keeps oneDNN's copy and, where pairs are preferred, a pairs copy that a
    decode step's rows (3 .. PAIR_ROWS) take, bit for bit pair_linear; past them oneDNN's."""
    model = _layers()
    assert pack_cpu_linears(model) == 3  # proj, gate/up stacked, down
    preferred = load_cpu_kernels().pair_linear_preferred()
    for packed in (model.proj.packed_weight, model.mlp.packed_gate_up, model.mlp.down_proj.packed_weight):
        assert isinstance(packed, DecodePairs) == preferred
    if not preferred:
        return
    both = model.proj.packed_weight
    for rows in (3, 17, PAIR_ROWS, PAIR_ROWS + 1, 70):
        x = torch.randn(rows, 64).bfloat16()
        with torch.inference_mode():
            got = model.proj(x)
        copy = both.pairs if rows <= PAIR_ROWS else both.onednn
        assert torch.equal(got, packed_linear(x, copy, model.proj.bias)), rows
        ref = x.double() @ model.proj.weight.double().T + model.proj.bias.double()
        assert ((got.double() - ref).abs() / (ref.abs() + 1)).max().item() < 1e-2
        with torch.inference_mode():
            mlp = model.mlp(x)
        gate, up = x.double() @ model.mlp.gate_proj.weight.double().T, x.double() @ model.mlp.up_proj.weight.double().T
        ref = (torch.nn.functional.silu(gate) * up) @ model.mlp.down_proj.weight.double().T
        assert ((mlp.double() - ref).abs() / (ref.abs() + 1)).max().item() < 3e-2


def test_pairs_copies_only_while_small_beside_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAM_CPU_PAIR_COPIES", "0.0000001")  # a few bytes of this machine's memory
    model = _layers()
    pack_cpu_linears(model)
    assert isinstance(model.proj.packed_weight, torch.Tensor)
    assert isinstance(model.mlp.packed_gate_up, torch.Tensor)


def test_switch_off_keeps_onednn_for_layers_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAM_CPU_PAIR_LINEAR", "0")
    model = _layers()
    pack_cpu_linears(model)
    assert isinstance(model.proj.packed_weight, torch.Tensor)
    assert isinstance(model.mlp.packed_gate_up, torch.Tensor)
