"""Quantized models under tensor parallelism (tensor_parallel_size 2: the mp executor, gloo on CPU).

GPTQ, AWQ and compressed-tensors checkpoints (packed by hf_quant_packers.py, as the formats do): each
rank holds its slice of every quantized Linear (checkpoint_shards.py), and greedy tokens and logprobs
match transformers on the checkpoint's dequantized weights. On-the-fly int8 / int4 quantize each
rank's float shard; they match transformers on those shards quantized one by one. A rank's share of
groups that act-order scatters or the rank boundary cuts is stored as runs of 32 columns. Each TP
engine starts once, is checked for leaked KV blocks and is shut down with its workers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator

import pytest
import torch
from conftest import assert_no_leak
from hf_quant_packers import LINEARS, awq_tensors, compressed_tensors, gptq_tensors, quantize
from quant_oracle import assert_matches_oracle, float_model_dir, hf_oracle, write_checkpoints
from safetensors.torch import load_file, save_file

from tram import LLM
from tram.config import ModelConfig
from tram.distributed import parallel_state
from tram.model.layers.parallel_linear import Shard
from tram.model.loader import load_model
from tram.model.quant.apply import quantize_weight
from tram.model.quant.checkpoint_shards import shard_weight
from tram.model.quant.checkpoint_weight import CheckpointInt4Weight, int8_weight
from tram.model.quant.unpacked import Int4Parts, int4_weight

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # the rest of LINEARS: o_proj, down_proj
TP = 2
PROMPTS = [
    [1, 17, 300, 45, 9],
    [1, 200, 201, 202, 203, 204, 205, 206],
    [1, 5],
    [1] + list(range(60, 83)),
]  # 24 tokens: prefill past the skinny kernel's rows (the int4 GEMM)

Writer = Callable[[str, torch.Tensor, int], tuple[dict[str, torch.Tensor], torch.Tensor]]


# ---- checkpoints -------------------------------------------------------------------------------
def _gptq(group: int, sym: bool, act_order: bool = False) -> tuple[dict, Writer]:
    config = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "desc_act": act_order,
        "sym": sym,
        "checkpoint_format": "gptq",
        "lm_head": False,
        "static_groups": False,
    }

    def writer(name: str, w: torch.Tensor, i: int):
        qw = quantize(w, group, sym, act_order=act_order, seed=i)
        return gptq_tensors(qw), qw.dequantize()

    return config, writer


def _awq(group: int) -> tuple[dict, Writer]:
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}

    def writer(name: str, w: torch.Tensor, i: int):
        qw = quantize(w, group, sym=False, act_order=False)
        return awq_tensors(qw), qw.dequantize()

    return config, writer


# compressed-tensors with three config groups, so that one checkpoint has W4A16 by groups with zero
# points, W4A16 per channel and W8A16, each on a column- and a row-parallel layer: (bits, group, sym).
CT_GROUPS = {
    "re:.*self_attn\\.(q|k|o)_proj$": (4, 64, False),
    "re:.*(self_attn\\.v_proj|layers\\.0\\.mlp\\.down_proj|mlp\\.gate_proj)$": (8, -1, True),
    "re:.*(mlp\\.up_proj|layers\\.1\\.mlp\\.down_proj)$": (4, -1, True),
}


def _ct_mixed() -> tuple[dict, Writer]:
    groups = {}
    for i, (target, (bits, group, sym)) in enumerate(CT_GROUPS.items()):
        fmt = "pack-quantized" if bits == 4 else "int-quantized"
        weights = {
            "num_bits": bits,
            "type": "int",
            "symmetric": sym,
            "strategy": "group" if group > 0 else "channel",
            "group_size": group if group > 0 else None,
            "dynamic": False,
            "actorder": None,
        }
        groups[f"group_{i}"] = {"targets": [target], "weights": weights, "input_activations": None, "format": fmt}
    config = {
        "quant_method": "compressed-tensors",
        "format": "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }

    def writer(name: str, w: torch.Tensor, i: int):
        bits, group, sym = next(s for t, s in CT_GROUPS.items() if re.match(t[3:], name.removesuffix(".weight")))
        qw = quantize(w, group, sym, act_order=False, bits=bits, seed=i, scale_dtype=torch.bfloat16)
        return compressed_tensors(qw, bits, sym), qw.dequantize()

    return config, writer


# Act-order GPTQ: each rank holds parts of every group of o_proj and down_proj, in runs of 32 columns.
# Symmetric int4 slices as the asymmetric does (ct-mixed has it per channel).
SCHEMES = {"gptq-g64-asym-actorder": _gptq(64, False, act_order=True), "awq-g128": _awq(128), "ct-mixed": _ct_mixed()}


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # o_proj's 256 and down_proj's 512 input columns: 128 and 256 per rank, whole groups of 64 and 128.
    return float_model_dir(tmp_path_factory.mktemp("float"))


@pytest.fixture(scope="module")
def checkpoints(float_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """scheme -> (quantized folder, float folder of its dequantized weights)."""
    names = sorted(load_file(os.path.join(float_dir, "model.safetensors")))  # write_quantized's order
    named = {
        scheme: (config, lambda w, i, writer=writer: writer(names[i], w, i))
        for scheme, (config, writer) in SCHEMES.items()
    }
    return write_checkpoints(float_dir, tmp_path_factory.mktemp("quantized"), named)


def _sharded_oracle(float_dir: str, out_dir: str, method: str) -> str:
    """A float checkpoint of what on-the-fly `method` computes over TP ranks: each rank's shard of each
    decoder linear quantized on its own (a row-parallel rank's int8 scales come from its half rows)."""
    shutil.copytree(float_dir, out_dir)
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for name, w in tensors.items():
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if leaf in LINEARS:
            shards = [quantize_weight(method, part.contiguous()) for part in w.chunk(TP, 0 if leaf in COLUMN else 1)]
            assert all(used.startswith(method) for _, used in shards)  # int4 stays int4: no int8 fallback
            tensors[name] = torch.cat([qw.dequantize() for qw, _ in shards], 0 if leaf in COLUMN else 1)
    save_file(tensors, path, metadata={"format": "pt"})
    return out_dir


# ---- engines -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _tp_llm(path: str, **kwargs) -> Iterator[LLM]:
    """A TP engine for one test: its KV blocks checked for leaks, then shut down with its workers."""
    llm = LLM(path, tensor_parallel_size=TP, max_num_seqs=4, max_model_len=256, **kwargs)
    procs = list(llm.llm_engine.engine_core.executor._procs)
    assert len(procs) == TP
    try:
        yield llm
        assert_no_leak(llm.llm_engine)
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert all(proc.poll() is not None for proc in procs)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_checkpoint_greedy_and_logprobs_match_transformers(checkpoints, scheme: str):
    path, oracle_dir = checkpoints[scheme]
    with _tp_llm(path) as llm:
        assert llm.llm_engine.config.model_config.quantization == SCHEMES[scheme][0]["quant_method"]
        assert_matches_oracle(llm, hf_oracle(oracle_dir), PROMPTS, 10)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_on_the_fly_quantizes_each_ranks_shard(float_dir: str, tmp_path, method: str):
    oracle_dir = _sharded_oracle(float_dir, str(tmp_path / method), method)
    with _tp_llm(float_dir, quantization=method) as llm:
        assert_matches_oracle(llm, hf_oracle(oracle_dir), PROMPTS, 10)


# ---- each rank's slice -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["gptq-g64-asym-actorder", "ct-mixed"])
def test_each_rank_holds_its_slice_of_every_quantized_layer(checkpoints, monkeypatch, scheme: str):
    """Rank r of 2 built in this process (no collectives are needed to load): every quantized Linear
    keeps its quantized form (no dense fallback) and dequantizes exactly to its slice."""
    path, oracle_dir = checkpoints[scheme]
    want = load_file(os.path.join(oracle_dir, "model.safetensors"))
    for rank in range(TP):
        monkeypatch.setattr(parallel_state, "_TP", parallel_state.TensorParallel(rank, TP))
        model = load_model(ModelConfig(path, device="cpu"))
        layers = {name: m for name, m in model.named_modules() if getattr(m, "quant", None) is not None}
        assert len(layers) == 2 * len(LINEARS)
        for name, module in layers.items():
            shard = module.shard
            assert shard.dim == (0 if name.rsplit(".", 1)[-1] in COLUMN else 1) and shard.size * TP == shard.full
            assert module.weight.numel() == 0
            expected = want[name + ".weight"].narrow(shard.dim, shard.start, shard.size)
            assert torch.equal(module.quant.dequantize(), expected), (rank, name)
            if "actorder" in scheme and shard.dim == 1:  # parts of scattered groups: runs of 32
                assert module.quant.group == 32 and module.quant.x_features == shard.size, name


def _parts(n: int, k: int, group: int, g_idx: torch.Tensor | None = None, seed: int = 0) -> Int4Parts:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, k // group, generator=g) * 0.02 + 0.001
    zero = torch.randint(0, 16, (n, k // group), generator=g, dtype=torch.uint8)
    return Int4Parts(q, scale, zero, group, g_idx)


def _row(rank: int, k: int) -> Shard:
    return Shard(1, rank * k // TP, k // TP, k)


def _assert_slice(p: Int4Parts, shard: Shard, runs: bool) -> None:
    """A row-parallel rank's int4 weight: exactly its columns of the layer, and its product that of
    the dequantized slice; `runs`: stored as runs of 32 (groups cut or scattered), else in place."""
    got = int4_weight(shard_weight(p, shard))
    want = p.dequantize().narrow(shard.dim, shard.start, shard.size)
    assert isinstance(got, CheckpointInt4Weight) and torch.equal(got.dequantize(), want)
    assert (got.group == 32) == runs, got.group  # the layers here have groups of 64 and more
    x = torch.randn(3, got.x_features, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(got.apply(x, None), x @ want.T, atol=1e-5, rtol=1e-5)


def test_row_slices_keep_whole_groups_and_store_cut_ones_in_runs():
    for rank in range(TP):
        _assert_slice(_parts(8, 256, 64), _row(rank, 256), runs=False)  # 128 columns: two whole groups
        _assert_slice(_parts(8, 256, 256), _row(rank, 256), runs=False)  # per channel: the rank's own group
        _assert_slice(_parts(8, 192, 64), _row(rank, 192), runs=True)  # 96 columns: a group cut in two
    cols = Shard(0, 4, 4, 8)  # column-parallel: rows, every group
    got = int4_weight(shard_weight(_parts(8, 256, 64), cols))
    assert torch.equal(got.dequantize(), _parts(8, 256, 64).dequantize()[4:])


def test_act_order_row_slices_keep_their_layout_where_groups_stay_whole_else_runs():
    k, group = 256, 64
    g = torch.Generator().manual_seed(1)
    # Act-order within each rank's half: groups 0-1 in columns 0..127, 2-3 in 128..255.
    local = torch.cat([torch.randperm(128, generator=g), 128 + torch.randperm(128, generator=g)])
    p = _parts(8, k, group, (local // group).long())
    for rank in range(TP):
        _assert_slice(p, _row(rank, k), runs=False)
        assert int4_weight(shard_weight(p, _row(rank, k))).perm is not None
    column = int4_weight(shard_weight(p, Shard(0, 0, 4, 8)))  # rows keep the act-order
    assert column.perm is not None and torch.equal(column.dequantize(), p.dequantize()[:4])
    # Groups scattered over all of K, as GPTQ desc_act makes them: each rank holds ~half of each.
    scattered = _parts(8, k, group, (torch.randperm(k, generator=g) // group).long())
    for rank in range(TP):
        _assert_slice(scattered, _row(rank, k), runs=True)


def test_int8_slices_rows_with_their_scales_and_columns_with_all():
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-127, 128, (6, 64), generator=g, dtype=torch.int8)
    whole = int8_weight(q, torch.rand(6, generator=g))
    rows = shard_weight(whole, Shard(0, 3, 3, 6))
    assert torch.equal(rows.dequantize(), whole.dequantize()[3:])
    columns = shard_weight(whole, Shard(1, 32, 32, 64))
    assert torch.equal(columns.dequantize(), whole.dequantize()[:, 32:])
