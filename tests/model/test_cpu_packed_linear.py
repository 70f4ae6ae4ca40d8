"""oneDNN-packed linear weights (tram/model/cpu_packed.py) and their routing in tram/model/linear.py.

The packed path must give F.linear's result within float rounding for any row count (including
the 2-3 rows where routing switches from the skinny kernel), with bias, on Linear and on the LM
head tied or untied; a model loaded for the CPU must come back with its weights packed, and
TRAM_CPU_PACKED_LINEAR=0 must leave them plain.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tram.model import cpu_packed
from tram.model.cpu_packed import pack_cpu_linears, pack_weight, packed_linear
from tram.model.layers import LMHead, VocabEmbedding
from tram.model.linear import SKINNY_MAX_ROWS_BESIDE_PACKED, Linear, linear, linear_n

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative to |ref| + 1
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def make(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype),
            torch.randn(n, generator=g).to(dtype))


def packable(dtype: torch.dtype) -> bool:
    return pack_weight(torch.zeros(4, 4, dtype=dtype)) is not None


def assert_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = ((y.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < TOLERANCES[dtype], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 17, 64, 257])
def test_packed_matches_reference(rows: int, dtype: torch.dtype) -> None:
    if not packable(dtype):
        pytest.skip(f"oneDNN cannot run {dtype} on this CPU (no bf16 instructions): the layer keeps F.linear")
    x, w, b = make(rows, 96, 80, dtype)
    packed = pack_weight(w)
    assert packed is not None and packed.is_mkldnn
    ref = x.double() @ w.double().T + b.double()
    with torch.inference_mode():
        assert_close(packed_linear(x, packed, b), ref, dtype)
        routed = linear(x, w, b, packed)  # the skinny kernel for a row or two, oneDNN past that
    assert routed.shape == (rows, 96) and routed.dtype == dtype
    assert_close(routed, ref, dtype)


def test_routing_by_rows() -> None:
    """Past the skinny limit a packed layer runs oneDNN, which is not the skinny kernel's result bit
    for bit; at or under it the skinny kernel runs (bitwise equal to calling it without packing)."""
    x, w, b = make(8, 300, 288, torch.float32, seed=1)
    packed = pack_weight(w)
    limit = SKINNY_MAX_ROWS_BESIDE_PACKED[torch.float32]
    with torch.inference_mode():
        assert torch.equal(linear(x[:limit], w, b, packed), linear(x[:limit], w, b))
        assert torch.equal(linear(x, w, b, packed), packed_linear(x, packed, b))


def test_autograd_keeps_f_linear() -> None:
    x, w, b = make(5, 12, 8, torch.float32)
    w.requires_grad_(True)
    y = linear(x, w, b, pack_weight(w.detach()))
    y.sum().backward()  # the oneDNN op has no backward: linear() must not have used it
    assert w.grad is not None and torch.equal(y.detach(), F.linear(x, w.detach(), b))


def test_unsupported_weights_are_not_packed() -> None:
    assert pack_weight(torch.zeros(4, 4, dtype=torch.float16)) is None
    assert pack_weight(torch.zeros(4, 4, 4)) is None


def tiny_model(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = VocabEmbedding(50, 16, torch.float32)
    model.model.proj = Linear(16, 24)
    model.model.projs = torch.nn.ModuleList([Linear(16, 8), Linear(16, 8)])
    model.lm_head = LMHead(16, 50, torch.float32, tied=tied)
    if not tied:
        torch.nn.init.normal_(model.lm_head.weight)
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pack_cpu_linears_packs_layers_and_lm_head(tied: bool) -> None:
    model = tiny_model(tied)
    assert pack_cpu_linears(model) == 4
    assert all(m.packed_weight is not None and m.packed_weight.is_mkldnn
               for m in (model.model.proj, *model.model.projs, model.lm_head))
    assert "packed_weight" not in "".join(model.state_dict())  # loading and saving never see it
    hidden = torch.randn(6, 16)
    with torch.inference_mode():
        logits = model.lm_head(hidden, model.model.embed_tokens)
        head = model.model.embed_tokens.weight if tied else model.lm_head.weight
        assert_close(logits, hidden.double() @ head.double().T, torch.float32)
        outs = linear_n(hidden, list(model.model.projs))
        for out, layer in zip(outs, model.model.projs):
            assert_close(out, hidden.double() @ layer.weight.double().T + layer.bias.double(), torch.float32)


def test_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_packed.ENV_SWITCH, "0")
    model = tiny_model(tied=False)
    assert pack_cpu_linears(model) == 0
    assert model.model.proj.packed_weight is None and model.lm_head.packed_weight is None


def test_loaded_cpu_model_is_packed(stories_path: str) -> None:
    from tram.config import ModelConfig
    from tram.model.loader import load_model

    model = load_model(ModelConfig(model=stories_path, dtype="float32"))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed_weight is not None for m in linears)
    assert model.lm_head.packed_weight is not None
