"""Hugging Face quantized checkpoints (GPTQ, AWQ, compressed-tensors): random Llamas quantized and packed
by the formats' own rules (hf_quant_packers.py), read by Tram. Each layer must dequantize to exactly
the checkpoint's weight, and the whole model must match transformers running those dequantized
weights as a float checkpoint; unsupported schemes fail at start naming themselves."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_no_leak
from hf_quant_packers import AWQ_ORDER, awq_tensors, compressed_tensors, gptq_tensors, pack_rows, quantize
from kernel_checks import assert_slabs_match
from quant_oracle import assert_matches_oracle, float_model_dir, hf_oracle, write_checkpoints

from tram import LLM, SamplingParams
from tram.config import ModelConfig
from tram.model.kernels.cpu_kernels import cpu_kernels_available
from tram.model.loader import load_model
from tram.model.quant.check import check_quantization
from tram.model.quant.checkpoint_weight import CheckpointInt4Weight
from tram.model.quant.formats import parse_scheme
from tram.model.quant.unpacked import Int4Parts, int4_weight, unpack_int32
from tram.model.quant.weights import SKINNY_MAX_ROWS, reference_linear


def _gptq(group: int, sym: bool, desc_act: bool, v2: bool = False):
    config = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "desc_act": desc_act,
        "sym": sym,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
        "lm_head": False,
        "static_groups": False,
    }

    def writer(w: torch.Tensor, i: int):
        qw = quantize(w, group, sym, desc_act, seed=i)
        return gptq_tensors(qw, v2), qw.dequantize()

    return config, writer


def _awq(group: int):
    config = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }

    def writer(w: torch.Tensor, i: int):
        qw = quantize(w, group, sym=False, act_order=False)
        return awq_tensors(qw), qw.dequantize()

    return config, writer


def _compressed(bits: int, group: int, sym: bool, act_order: bool = False):
    strategy = "group" if group > 0 else "channel"
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "strategy": strategy,
        "group_size": group if group > 0 else None,
        "dynamic": False,
        "actorder": "group" if act_order else None,
        "observer": "minmax",
    }
    fmt = "pack-quantized" if bits == 4 else "int-quantized"
    config = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": fmt,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }

    def writer(w: torch.Tensor, i: int):
        qw = quantize(w, group, sym, act_order, bits=bits, seed=i, scale_dtype=torch.bfloat16)
        return compressed_tensors(qw, bits, sym, act_order), qw.dequantize()

    return config, writer


SCHEMES = {
    "gptq-g128-sym": _gptq(128, True, False),
    "gptq-g128-asym-actorder": _gptq(128, False, True),
    "gptq-channel-asym": _gptq(-1, False, False),
    "gptq-g64-sym-actorder-v2": _gptq(64, True, True, v2=True),
    "awq-g128": _awq(128),
    "awq-g64": _awq(64),
    "ct-w4a16-g128-sym": _compressed(4, 128, True),
    "ct-w4a16-channel-sym": _compressed(4, -1, True),
    "ct-w4a16-g64-asym-actorder": _compressed(4, 64, False, act_order=True),
    "ct-w8a16-channel": _compressed(8, -1, True),
}
END_TO_END = ("gptq-g128-asym-actorder", "awq-g128", "ct-w4a16-g128-sym", "ct-w8a16-channel")


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return float_model_dir(tmp_path_factory.mktemp("float"))


@pytest.fixture(scope="module")
def checkpoints(float_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """scheme -> (quantized folder, float folder of its dequantized weights)."""
    return write_checkpoints(float_dir, tmp_path_factory.mktemp("quantized"), SCHEMES)


# ---- formats and kernels -----------------------------------------------------------------------
def test_packers_agree_with_compressed_tensors_and_tram_unpacks_every_layout():
    q = torch.randint(0, 16, (24, 72), generator=torch.Generator().manual_seed(0))
    try:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    except ImportError:
        pack_to_int32 = None
    if pack_to_int32 is not None:  # K = 72: a padded last word
        assert torch.equal(pack_rows(q), pack_to_int32((q - 8).to(torch.int8), 4))
        assert torch.equal(pack_rows(q.t()).t(), pack_to_int32((q - 8).to(torch.int8), 4, packed_dim=0))
    assert torch.equal(unpack_int32(pack_rows(q), dim=1)[:, :72], q)
    assert torch.equal(unpack_int32(pack_rows(q.t()).t(), dim=0)[:24], q)
    assert torch.equal(unpack_int32(pack_rows(q[:, :64], AWQ_ORDER), dim=1, order=AWQ_ORDER), q[:, :64])
    word = pack_rows(q[:1, :8], AWQ_ORDER)[0, 0].item() & 0xFFFFFFFF
    assert [(word >> 4 * i) & 15 for i in range(8)] == [q[0, j].item() for j in AWQ_ORDER]


def _int4(n: int, k: int, group: int, zero: bool, perm: bool, seed: int = 0) -> CheckpointInt4Weight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // group, generator=g) * 0.02 + 0.001
    z = torch.randint(0, 16, (n, k // group), generator=g, dtype=torch.uint8) if zero else None
    return CheckpointInt4Weight(q, scale, group, z, torch.randperm(k, generator=g) if perm else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero,perm", [(True, False), (True, True), (False, True)])
def test_zero_point_kernel_matches_dequantize_then_matmul(dtype: torch.dtype, zero: bool, perm: bool):
    qw = _int4(40, 256, 64, zero, perm)
    bias = torch.randn(40).to(dtype)
    for rows in (1, 3, SKINNY_MAX_ROWS, SKINNY_MAX_ROWS + 1, 33):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
        with torch.inference_mode():
            got, want = qw.apply(x, bias), reference_linear(x, qw, bias)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("zero,perm", [(True, True), (False, True), (True, False)])
def test_many_rows_decode_slabs_with_zero_points(monkeypatch, zero: bool, perm: bool, dtype: torch.dtype):
    """The slabs (slab_gemm.py) of a checkpoint's int4: each slab's rows of the zero points, and x
    permuted to the stored column order first."""
    if not cpu_kernels_available():
        pytest.skip("the C++ kernels are not available")
    qw = _int4(100, 256, 64, zero, perm)
    assert_slabs_match(monkeypatch, qw, torch.randn(33, 256).to(dtype), torch.randn(100).to(dtype), 48)


def test_zero_point_kernel_is_invariant_to_batch_and_threads():
    qw = _int4(96, 320 - 64, 128, zero=True, perm=True, seed=3)
    x = torch.randn(SKINNY_MAX_ROWS, 256)
    threads = torch.get_num_threads()
    with torch.inference_mode():
        together = qw.apply(x, None)
        for i in range(x.shape[0]):
            assert torch.equal(qw.apply(x[i : i + 1], None), together[i : i + 1])
        torch.set_num_threads(1)
        try:
            assert torch.equal(qw.apply(x, None), together)
        finally:
            torch.set_num_threads(threads)


def test_zero_points_of_8_are_the_symmetric_kernel_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (48, 256), generator=g, dtype=torch.uint8)
    scale = torch.rand(48, 2, generator=g) * 0.02
    sym = CheckpointInt4Weight(q, scale, 128)
    asym = CheckpointInt4Weight(q, scale, 128, zero=torch.full((48, 2), 8, dtype=torch.uint8))
    x = torch.randn(4, 256)
    with torch.inference_mode():
        assert torch.equal(asym.apply(x, None), sym.apply(x, None))
        assert torch.equal(asym.apply(x.repeat(5, 1), None), sym.apply(x.repeat(5, 1), None))
    assert torch.equal(asym.dequantize(), sym.dequantize())


def test_partial_and_unequal_groups_run_in_runs_of_32_and_the_rest_dequantized():
    # K = 172 (stories260K's down_proj): groups of 128 leave a last one of 44 columns; act-order
    # groups of 32 come in unequal sizes. Both are stored as runs of 32 columns, the last run of a
    # group padded with zero weights. Per channel, the group (172) is no multiple of 32: dense.
    w = torch.randn(64, 172, generator=torch.Generator().manual_seed(2)) * 0.1
    x = torch.randn(5, 172, generator=torch.Generator().manual_seed(3))
    for group, act_order, width in ((128, False, 128 + 64), (32, True, None), (-1, True, None)):
        qw = quantize(w, group, sym=False, act_order=act_order)
        parts = Int4Parts(
            qw.q.to(torch.uint8),
            qw.scale.float(),
            qw.zero.to(torch.uint8),
            172 if group < 0 else group,
            qw.g_idx.long(),
        )
        weight = int4_weight(parts)
        if group < 0:
            assert isinstance(weight, torch.Tensor) and torch.equal(weight, qw.dequantize())
            continue
        assert isinstance(weight, CheckpointInt4Weight) and weight.group == 32 and weight.x_features == 172
        assert width is None or weight.in_features == width
        assert torch.equal(weight.dequantize(), qw.dequantize())
        torch.testing.assert_close(weight.apply(x, None), reference_linear(x, weight, None), atol=1e-5, rtol=1e-5)


# ---- loading -----------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_every_layer_dequantizes_to_the_checkpoints_weight(checkpoints, scheme: str):
    from safetensors.torch import load_file

    path, oracle = checkpoints[scheme]
    config = ModelConfig(path, device="cpu")
    assert config.quantization == SCHEMES[scheme][0]["quant_method"]
    model = load_model(config)
    want = load_file(os.path.join(oracle, "model.safetensors"))
    layers = {name: m for name, m in model.named_modules() if getattr(m, "quant", None) is not None}
    assert len(layers) == 2 * 7
    for name, module in layers.items():
        assert module.weight.numel() == 0
        assert torch.equal(module.quant.dequantize(), want[name + ".weight"]), name
    perms = [m.quant.perm for m in layers.values() if getattr(m.quant, "perm", None) is not None]
    assert bool(perms) == ("actorder" in scheme)


PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206], [1, 5]]


@pytest.mark.parametrize("scheme", END_TO_END)
def test_greedy_and_logprobs_match_transformers_on_the_dequantized_checkpoint(checkpoints, scheme: str):
    path, oracle_dir = checkpoints[scheme]
    llm = LLM(path, max_num_seqs=4, max_model_len=256, max_num_batched_tokens=8)
    assert llm.llm_engine.config.model_config.quantization == SCHEMES[scheme][0]["quant_method"]
    assert_matches_oracle(llm, hf_oracle(oracle_dir), PROMPTS, 10)
    assert_no_leak(llm.llm_engine)


# ---- what is refused, at start -----------------------------------------------------------------
def _ct(weights: dict, acts: dict | None = None, fmt: str = "pack-quantized") -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "int", "symmetric": True, "dynamic": False, **weights},
                "input_activations": acts,
            }
        },
    }


UNSUPPORTED = [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ 3-bit"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "GPTQ 8-bit"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ GEMV"),
    ({"quant_method": "awq", "bits": 3, "version": "gemm"}, "AWQ 3-bit"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
    (
        _ct({"num_bits": 8, "type": "float", "strategy": "channel"}, fmt="float-quantized"),
        "compressed-tensors float8 weights",
    ),
    (
        _ct(
            {"num_bits": 4, "strategy": "group", "group_size": 128},
            {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True},
        ),
        "compressed-tensors W4A8",
    ),
    (_ct({"num_bits": 8, "strategy": "group", "group_size": 128}, fmt="int-quantized"), "W8A16 group"),
    (_ct({"num_bits": 2, "strategy": "group", "group_size": 128}), "compressed-tensors 2-bit"),
]


@pytest.mark.parametrize("config,named", UNSUPPORTED, ids=[named for _, named in UNSUPPORTED])
def test_unsupported_schemes_are_named(config: dict, named: str):
    with pytest.raises(ValueError, match=f"{named}.*not supported.*Tram reads GPTQ 4-bit"):
        parse_scheme(SimpleNamespace(quantization_config=config))


def test_refusals_happen_at_start_with_clear_messages(checkpoints, float_dir: str, tmp_path):
    gptq, _ = checkpoints["gptq-g128-sym"]
    with pytest.raises(ValueError, match="'int8' quantizes a float checkpoint.*already quantized \\(gptq\\)"):
        LLM(gptq, quantization="int8")
    with pytest.raises(ValueError, match="'awq' does not match.*'gptq'"):
        LLM(gptq, quantization="awq")
    with pytest.raises(ValueError, match="'gptq' reads a gptq checkpoint.*no quantization_config"):
        LLM(float_dir, quantization="gptq")
    check_quantization("awq", "cuda")  # the Triton GEMM (test_triton_quant_linear.py)
    with pytest.raises(ValueError, match="runs on CPU and CUDA devices, not 'mps'"):
        check_quantization("awq", "mps")
    bad = tmp_path / "gptq3"
    bad.mkdir()
    with open(os.path.join(gptq, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"]["bits"] = 3
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPTQ 3-bit is not supported"):
        LLM(str(bad))
    assert (
        LLM(gptq, quantization="gptq", max_model_len=64)
        .generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )


def test_quantized_layers_never_allocate_their_float_weight(checkpoints):
    # A GPU holds the packed weights only: `plan` drops the float weights on the meta-device model,
    # before anything is allocated, and the layers that the checkpoint does not quantize keep theirs.
    from tram.model.attention import get_attention_backend
    from tram.model.loader import safetensors_files
    from tram.model.quant.checkpoints import checkpoint_loader
    from tram.model.registry import get_model_class

    path, _ = checkpoints["awq-g128"]
    config = ModelConfig(path, device="cpu")
    config.resolve()
    with torch.device("meta"):
        model = get_model_class(config.architecture)(
            config.hf_config, config.torch_dtype, get_attention_backend(config.attention_backend)
        )
    quant = checkpoint_loader(config.quantization, config.hf_config, torch.device("cpu"), model)
    quant.plan(safetensors_files(path))
    emptied = {name for name, p in model.named_parameters() if p.numel() == 0}
    assert emptied == {name + ".weight" for name in quant.quantized} and len(emptied) == 2 * 7
    assert model.lm_head.weight.numel() > 0
