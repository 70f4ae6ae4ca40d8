"""The fused MoE kernel's bfloat16 experts with many tokens through ATen's GEMM (csrc/moe_aten_gemm.h):
an expert with MIN_TOKENS tokens or more multiplies its gathered rows, rounded up to a multiple of 16,
with oneDNN's bf16 GEMM, its outputs and act rounded to bfloat16 between the stages; fewer stay on the
vector dot products. On a CPU with AMX the tiles take those experts first, so these tests forbid them."""

from __future__ import annotations

import pytest
import torch
from moe_oracle import bf16_experts, reference_moe, stacked

from tram.model.kernels.cpu_kernels import cpu_kernels_available, load_cpu_kernels
from tram.model.layers.moe.cpu_kernel import cpu_fused_moe, takes_every_token_count
from tram.model.layers.moe.experts import ExpertWeights

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ CPU kernels did not build")

E, K, H, I = 8, 2, 128, 72  # I = 4 x 16 + 8: the activation's vector loop and its tail
MIN_TOKENS = 8  # moe_aten_gemm.h's kMinTokens


@pytest.fixture(autouse=True)
def _no_grad_no_tiles():
    kernels = load_cpu_kernels()
    allowed = kernels.cpu_amx(None)
    kernels.cpu_amx(False)
    try:
        with torch.inference_mode():
            yield
    finally:
        kernels.cpu_amx(allowed)


def experts(seed: int, bias: bool) -> tuple[torch.Tensor, ...]:
    return bf16_experts(E, H, I, seed, bias)


def routing(T: int, busy: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert `busy` in every token's first slot (T tokens, not a multiple of 16: its GEMM rows run on
    into the next experts' pairs, or past the last pair when it is the last expert), the second slot
    over the others at random, two slots dropped (experts on another rank)."""
    g = torch.Generator().manual_seed(seed)
    others = torch.tensor([e for e in range(E) if e != busy])
    second = others[torch.randint(0, E - 1, (T,), generator=g)]
    ids = torch.stack([torch.full((T,), busy), second], dim=1).to(torch.int32)
    ids[torch.randperm(T, generator=g)[:2], 1] = -1
    weights = torch.rand(T, K, generator=g).softmax(-1)
    return ids, weights


def run(x, ids, weights, w13, w2, b13, b2, activation) -> torch.Tensor:
    return cpu_fused_moe(x, ids, weights, stacked(w13), stacked(w2), b13, b2, activation)


def one_at_a_time(x, ids, weights, *layer) -> torch.Tensor:
    """Each token in its own call: every expert has one token, so the vector paths throughout."""
    return torch.cat([run(x[t : t + 1], ids[t : t + 1], weights[t : t + 1], *layer) for t in range(x.shape[0])])


@pytest.mark.parametrize("T,busy", [(9, 0), (37, E - 1), (70, 3)])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_experts_match_the_reference_and_the_vector_paths(T, busy, activation, bias):
    w13, w2, b13, b2 = experts(seed=T, bias=bias)
    x = torch.randn(T, H).bfloat16()
    ids, weights = routing(T, busy, seed=T)
    assert (ids == busy).sum() >= MIN_TOKENS
    out = run(x, ids, weights, w13, w2, b13, b2, activation)
    vector = one_at_a_time(x, ids, weights, w13, w2, b13, b2, activation)
    ref = reference_moe(x, ids, weights, w13, w2, b13, b2, activation)
    scale = ref.float().abs().max().item()
    # bf16 outputs: oneDNN's sums and the bf16 roundings between the stages move a result by an ulp or two
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale)
    torch.testing.assert_close(out.float(), vector.float(), rtol=2e-2, atol=2e-2 * scale)
    assert not torch.equal(out, vector)  # the GEMM did run


def test_experts_below_the_threshold_stay_on_the_vector_paths():
    """With every expert under MIN_TOKENS a call gives the bits of one token at a time."""
    w13, w2, _, _ = experts(seed=1, bias=False)
    T = 3 * E  # each expert in 2 x 3 tokens' slots
    x = torch.randn(T, H).bfloat16()
    ids = torch.stack([torch.arange(T) % E, (torch.arange(T) + 1) % E], dim=1).to(torch.int32)
    assert max((ids == e).sum() for e in range(E)) < MIN_TOKENS
    weights = torch.rand(T, K)
    out = run(x, ids, weights, w13, w2, None, None, "silu")
    assert torch.equal(out, one_at_a_time(x, ids, weights, w13, w2, None, None, "silu"))


def test_the_layer_keeps_bf16_experts_on_the_kernel_at_prefill():
    """The kernel beats the grouped path at every token count for bf16 experts (GEMM or tiles past a few
    tokens each), so a prefill's bf16 experts stay on it; float32 and int8 ones keep the crossover."""
    w13, w2, _, _ = experts(seed=4, bias=False)
    bf16 = torch.zeros(1, H, dtype=torch.bfloat16)
    assert takes_every_token_count(bf16, stacked(w13), stacked(w2))
    assert not takes_every_token_count(torch.zeros(1, H), stacked(w13.float()), stacked(w2.float()))
    int8 = ExpertWeights("int8", torch.zeros(E, 2 * I, H, dtype=torch.int8), 2 * I, H, scale=torch.ones(E, 2 * I))
    assert not takes_every_token_count(bf16, int8, stacked(w2))
