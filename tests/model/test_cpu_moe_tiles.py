"""The fused MoE kernel's bfloat16 experts on AMX tiles (csrc/moe_amx.h): an expert with a few tokens or
more multiplies them on the tile unit, its act rounded to bfloat16 between the projections; fewer stay
on the vector dot products. Where the build or the CPU has no AMX the tile tests skip."""

from __future__ import annotations

import pytest
import torch
from moe_oracle import bf16_experts, reference_moe, stacked

from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels
from tram.model.layers.moe.cpu_kernel import cpu_fused_moe

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ CPU kernels did not build")

E, K, H, I = 8, 2, 128, 96  # H and I whole blocks of 32 k: the tiles' shapes
MIN_TOKENS = 4  # moe_amx.h's kMinTokens


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.inference_mode():
        yield


@pytest.fixture
def tiles():
    kernels = load_cpu_kernels()
    if not kernels.fused_moe_tiles(H, I):
        pytest.skip("this build or CPU has no AMX tiles")
    return kernels


def experts(seed: int, bias: bool) -> tuple[torch.Tensor, ...]:
    return bf16_experts(E, H, I, seed, bias)


def skewed_routing(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert 0 in every token's first slot (T tokens: an odd number of 16-token tiles for T = 17 .. 31),
    the second slot over the others at random (some with fewer than MIN_TOKENS), a few slots dropped
    (experts on another rank)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.zeros(T, dtype=torch.long), torch.randint(1, E, (T,), generator=g)], dim=1)
    ids = ids.to(torch.int32)
    ids[torch.randperm(T, generator=g)[:2], 1] = -1
    weights = torch.rand(T, K, generator=g).softmax(-1)
    return ids, weights


def run(x, ids, weights, w13, w2, b13, b2, activation) -> torch.Tensor:
    return cpu_fused_moe(x, ids, weights, stacked(w13), stacked(w2), b13, b2, activation)


@pytest.mark.parametrize("T", [5, 23, 70])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("bias", [False, True])
def test_tiles_match_the_reference_and_the_vector_paths(tiles, T, activation, bias):
    w13, w2, b13, b2 = experts(seed=T, bias=bias)
    x = torch.randn(T, H).bfloat16()
    ids, weights = skewed_routing(T, seed=T)
    on_tiles = run(x, ids, weights, w13, w2, b13, b2, activation)
    try:
        tiles.cpu_amx(False)
        assert not tiles.fused_moe_tiles(H, I)
        vector = run(x, ids, weights, w13, w2, b13, b2, activation)
    finally:
        tiles.cpu_amx(True)
    ref = reference_moe(x, ids, weights, w13, w2, b13, b2, activation)
    scale = ref.float().abs().max().item()
    # bf16 outputs: the tile unit's sums and act rounded to bf16 move a result by an ulp or two of bf16
    torch.testing.assert_close(on_tiles.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale)
    torch.testing.assert_close(on_tiles.float(), vector.float(), rtol=2e-2, atol=2e-2 * scale)
    assert not torch.equal(on_tiles, vector)  # the tiles did run


def test_a_tokens_result_does_not_depend_on_the_others(tiles):
    """An output of the tile unit depends on its token and its weight row only: the same rows of a
    smaller call (every expert still over MIN_TOKENS) and any thread count give the same bits."""
    w13, w2, _, _ = experts(seed=3, bias=False)
    T = 48
    x = torch.randn(T, H).bfloat16()
    ids = torch.stack([torch.arange(T) % 4, 4 + torch.arange(T) % 4], dim=1).to(torch.int32)
    weights = torch.rand(T, K)
    full = run(x, ids, weights, w13, w2, None, None, "silu")
    part = run(x[:20], ids[:20], weights[:20], w13, w2, None, None, "silu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = run(x, ids, weights, w13, w2, None, None, "silu")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(full[:20], part) and torch.equal(full, one_thread)
