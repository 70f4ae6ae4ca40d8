"""The decode step with its kernels chosen once (tram/model/layers/cpu_decode.py) against the module path
it stands in for: the same logits bit for bit, step after step, over the layer features it covers
(biases, q/k norms, NoPE layers, sliding windows, sinks, soft caps, Gemma's norms and GeGLU, an MoE's MLP
through its module, GGUF weights with float and int8 activations), with decode batches of 1-3 and 18 rows and
prefill steps between."""

from __future__ import annotations

import pytest
import torch
from hf_models import PagedRunner, make_hf_model_dir

from tram.config import ModelConfig
from tram.model.kernels.cpu_kernels import cpu_kernels_available
from tram.model.layers import cpu_decode
from tram.model.layers.norm import RMSNorm
from tram.model.loader import get_hf_config, load_model

needs_kernels = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ kernels are not available")

# Request id -> new tokens, one list per step: prefills, then decode batches of one to three rows, a
# step that mixes a decode and a prefill (the module path), decodes again, and a batch of 18.
STEPS: list[list[tuple[str, list[int]]]] = [
    [("a", [5, 9, 14, 3, 77, 21, 8])],
    [("a", [30])],
    [("b", [4, 18, 61, 2, 7])],
    [("a", [31]), ("b", [90])],
    [("a", [32]), ("b", [91])],
    [("a", [33]), ("b", [92]), ("c", [6, 44, 12])],
    [("a", [34]), ("b", [93]), ("c", [13])],
    [("c", [14])],
    [("a", [35]), ("b", [94]), ("c", [15])],
    # 18 rows: past every row kernel's limit (the GGUF float kernel's 16), each linear on its module
    [(f"r{i}", [3 + i, 40 + i]) for i in range(18)],
    [(f"r{i}", [60 + i]) for i in range(18)],
    [(f"r{i}", [80 + i]) for i in range(18)],
]


def _load(path: str, dtype: torch.dtype) -> torch.nn.Module:
    config = ModelConfig(
        model=path, hf_config=get_hf_config(path), dtype=dtype, device=torch.device("cpu"), max_model_len=512
    )
    return load_model(config)


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.model.layers)


def _blocks(ggml_type: int, n: int, k: int, seed: int) -> torch.Tensor:
    """[n, row_bytes] random blocks of a 32-wide type whose fp16 scale (and min) lead each block."""
    from tram.model.gguf.weight import BLOCK_SIZES, Q4_1

    gen = torch.Generator().manual_seed(seed)
    block, size = BLOCK_SIZES[ggml_type]
    raw = torch.randint(0, 256, (n, k // block, size), dtype=torch.uint8, generator=gen)
    for field in range(2 if ggml_type == Q4_1 else 1):
        scales = (torch.randn(n, k // block, 1, generator=gen) * 0.05 / 8).to(torch.float16)
        raw[..., 2 * field : 2 * field + 2] = scales.view(torch.uint8)
    return raw.reshape(n, -1)


def _as_gguf(model: torch.nn.Module, int8: bool) -> None:
    """Every linear of every layer becomes a GGUF weight of random blocks (a mix of types per layer)."""
    from tram.model.gguf.weight import Q4_0, Q4_1, Q8_0, GGUFWeight

    types = (Q8_0, Q4_0, Q4_1)
    seed = 0
    for layer in _layers(model):
        layer.self_attn.packed_qkv = layer.mlp.packed_gate_up = None  # as the GGUF loader leaves them
        linears = [*layer.self_attn.stacked_linears(), layer.self_attn.o_proj]
        linears += [layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
        for linear in linears:
            n, k = linear.weight.shape
            t = types[seed % len(types)]
            linear.quant = GGUFWeight(_blocks(t, n, k, seed), t, k, int8_activations=int8)
            linear.packed_weight = None
            seed += 1


def _run(model: torch.nn.Module, path: str) -> list[torch.Tensor]:
    runner = PagedRunner(model, get_hf_config(path), block_size=4)
    return [logits for step in STEPS for logits in runner.step(step)]


def _assert_same_bits(path: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, gguf: bool | None = None) -> None:
    fast, slow = _load(path, dtype), _load(path, dtype)
    if gguf is not None:
        _as_gguf(fast, gguf)
        _as_gguf(slow, gguf)
    for layer in _layers(slow):
        layer.cpu_decode = False  # the module path
    ran: list[int] = []
    for program in (cpu_decode.CpuDecodeLayer, cpu_decode.GemmaDecodeLayer):

        def counted(self, x, *args, call=program.__call__):  # noqa: ANN001, ANN202
            out = call(self, x, *args)
            if out is not None:
                ran.append(x.shape[0])
            return out

        monkeypatch.setattr(program, "__call__", counted)
    got, want = _run(fast, path), _run(slow, path)
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}: max diff {(g - w).abs().max().item()}"
    assert set(ran) >= {1, 2, 3, 18}, ran  # the program ran every decode-only step


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "kind", ["llama_gqa", "qwen2", "qwen3", "mistral", "smollm3", "gpt_oss", "qwen3_moe", "gemma3", "gemma2"]
)
def test_decode_program_gives_the_module_paths_bits(
    tmp_path, kind: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"sliding_window": 6} if kind == "mistral" else {}
    _assert_same_bits(make_hf_model_dir(tmp_path, kind, **overrides), dtype, monkeypatch)


@needs_kernels
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_decode_program_on_gguf_weights_gives_the_module_paths_bits(
    tmp_path, int8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_same_bits(make_hf_model_dir(tmp_path, "llama_gqa"), torch.float32, monkeypatch, gguf=int8)


@needs_kernels
def test_a_layer_the_program_cannot_take_keeps_the_module_path(tmp_path) -> None:
    path = make_hf_model_dir(tmp_path, "llama_gqa")
    model = _load(path, torch.float32)
    _run(model, path)
    assert all(isinstance(layer.cpu_decode, cpu_decode.CpuDecodeLayer) for layer in _layers(model))

    # A norm the program does not know (a subclass may round otherwise): the layer keeps its module path.
    class OtherNorm(RMSNorm):
        pass

    other = _load(path, torch.float32)
    for layer in _layers(other):
        layer.input_layernorm.__class__ = OtherNorm
    want = _run(_load(path, torch.float32), path)
    assert all(torch.equal(g, w) for g, w in zip(_run(other, path), want, strict=True))
    assert all(layer.cpu_decode is False for layer in _layers(other))


@needs_kernels
def test_the_switch_keeps_every_layer_on_the_module_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_hf_model_dir(tmp_path, "llama_gqa")
    monkeypatch.setenv("TRAM_CPU_DECODE_PROGRAM", "0")
    model = _load(path, torch.float32)
    _run(model, path)
    assert all(layer.cpu_decode is False for layer in _layers(model))
