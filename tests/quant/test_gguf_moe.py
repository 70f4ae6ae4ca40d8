"""Mixtures of experts served from the GGUF files llama.cpp's tools write for them: qwen3moe, and
Mixtral (written as llama with `expert_count` and stacked `ffn_*_exps` tensors), from tiny random
Hugging Face models (rows of 256, so that Q4_K_M keeps K-quants in the experts).

The oracles:
  * float32 files: transformers. For qwen3moe, on the same file (`gguf_file=`) with the config Tram
    reads from it: transformers' own reading of a qwen3moe file drops `expert_feed_forward_length`
    (its experts then have Qwen3MoeConfig's default width, and the load fails). Mixtral written as
    llama is no model transformers' GGUF loading knows (it reads a dense Llama and leaves the MLPs
    random; with a Mixtral config, gguf-py has no "mixtral" tensor map), so its oracle is the original
    Hugging Face folder, which the float32 conversion keeps exactly;
  * quantized files (Q4_K_M: Q4_K and Q6_K experts; Q8_0): the experts stay in their blocks, and
    the tokens are those of the same file dequantized by llama.cpp (llama-quantize to F32), served
    by Tram; for qwen3moe also transformers on the quantized file, which dequantizes it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import assert_no_leak
from gguf_tools import convert_batch, dequantize, quantize
from hf_models import make_hf_model_dir
from quant_oracle import oracle_continuation

from tram import LLM, SamplingParams
from tram.model.layers.moe.layer import FusedMoE

PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206], [1, 5], [1, 99, 98, 97, 96, 95, 94]]
MAX_TOKENS = 12
# llama.cpp has no dense layers in qwen3moe and always renormalises its top k (archs.py).
QWEN3_MOE = dict(
    norm_topk_prob=True, mlp_only_layers=[], num_hidden_layers=2, hidden_size=256, moe_intermediate_size=256
)
MIXTRAL = dict(hidden_size=256, intermediate_size=256, head_dim=64)
FAMILIES = {"qwen3_moe": ("Qwen3MoeForCausalLM", QWEN3_MOE), "mixtral": ("MixtralForCausalLM", MIXTRAL)}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ "<family>" (its Hugging Face folder), "<family>-<type>" (GGUF files: f32, q4_k_m and its
    dequantized f32 copy "q4_k_m-f32"; q8_0 for qwen3_moe)."""
    root = tmp_path_factory.mktemp("gguf_moe")
    out: dict[str, Path] = {kind: Path(make_hf_model_dir(root, kind, **over)) for kind, (_, over) in FAMILIES.items()}
    jobs = [(str(out[kind]), "f32", root / f"{kind}-f32.gguf") for kind in FAMILIES]
    jobs.append((str(out["qwen3_moe"]), "q8_0", root / "qwen3_moe-q8_0.gguf"))
    # The random models carry a sentencepiece tokenizer, which Qwen's converter class would refuse.
    convert_batch(jobs, sentencepiece_vocab=("Qwen3MoeForCausalLM",))
    for _, _, path in jobs:
        out[path.stem] = path
    for kind in FAMILIES:
        out[f"{kind}-q4_k_m"] = quantize(out[f"{kind}-f32"], root / f"{kind}-q4_k_m.gguf", "Q4_K_M")
        out[f"{kind}-q4_k_m-f32"] = dequantize(out[f"{kind}-q4_k_m"], root / f"{kind}-q4_k_m-f32.gguf")
    return out


def _llm(files: dict[str, Path], kind: str, name: str) -> LLM:
    # 32 batched tokens: the four prompts prefill in two steps, then decode together.
    return LLM(
        str(files[f"{kind}-{name}"]),
        tokenizer=str(files[kind]),
        max_num_seqs=4,
        max_model_len=256,
        max_num_batched_tokens=32,
    )


def _moe_layers(llm: LLM) -> list[FusedMoE]:
    model = llm.llm_engine.engine_core.executor.model_runner.model
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


def _expert_types(llm: LLM) -> list[tuple[str, str]]:
    """Each layer's (w13, w2) as the GGUF type its blocks keep, or "float"."""
    from gguf import GGMLQuantizationType

    def name(w: object) -> str:
        return "float" if w is None else GGMLQuantizationType(w.file_type).name

    return [(name(m.w13), name(m.w2)) for m in _moe_layers(llm)]


def _generate(llm: LLM) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their logprobs, per prompt."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    result = []
    for out in outs:
        comp = out.outputs[0]
        result.append((list(comp.token_ids), [row[t].logprob for t, row in zip(comp.token_ids, comp.logprobs)]))
    assert_no_leak(llm.llm_engine)
    return result


def _transformers(files: dict[str, Path], kind: str, name: str) -> torch.nn.Module:
    import transformers

    from tram.model.gguf.file import load_gguf_config

    if kind == "mixtral":
        assert name == "f32"
        return transformers.AutoModelForCausalLM.from_pretrained(str(files[kind]), dtype=torch.float32).eval()
    gguf = files[f"{kind}-{name}"]
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, config=load_gguf_config(str(gguf)), dtype=torch.float32
    ).eval()


def _assert_matches(got: list[tuple[list[int], list[float]]], oracle: torch.nn.Module) -> None:
    """Greedy tokens equal the oracle's, chosen-token logprobs within 1e-3 of its log-softmax."""
    for p, (tokens, logprobs) in zip(PROMPTS, got):
        want, ref = oracle_continuation(oracle, p, tokens, MAX_TOKENS)
        assert tokens == want, p
        chosen = [ref[len(p) - 1 + i, t].item() for i, t in enumerate(tokens)]
        assert logprobs == pytest.approx(chosen, abs=1e-3), p


_NOT_IN_FILE = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_float32_file_matches_transformers(files: dict[str, Path], kind: str):
    import transformers

    from tram.model.gguf.file import load_gguf_config

    config = load_gguf_config(str(files[f"{kind}-f32"]))
    assert config.architectures == [FAMILIES[kind][0]]
    want = transformers.AutoConfig.from_pretrained(str(files[kind])).to_dict()
    got = config.to_dict()
    assert {k: (v, got.get(k)) for k, v in want.items() if k not in _NOT_IN_FILE and got.get(k) != v} == {}
    llm = _llm(files, kind, "f32")
    assert _expert_types(llm) == [("float", "float")] * 2  # float files fill the float parameters
    _assert_matches(_generate(llm), _transformers(files, kind, "f32"))


@pytest.mark.parametrize(
    "kind, name, types",
    [
        # llama-quantize's Q4_K_M gives the down projections more bits in some layers.
        ("qwen3_moe", "q4_k_m", [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")]),
        ("mixtral", "q4_k_m", [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")]),
        ("qwen3_moe", "q8_0", [("Q8_0", "Q8_0")] * 2),
    ],
)
def test_quantized_experts_stay_in_their_blocks(files: dict[str, Path], kind: str, name: str, types):
    llm = _llm(files, kind, name)
    assert _expert_types(llm) == types
    for moe in _moe_layers(llm):
        assert moe.w13.kind == moe.w2.kind == "gguf" and moe.w13_weight.numel() == moe.w2_weight.numel() == 0
    model = llm.llm_engine.engine_core.executor.model_runner.model
    routers = [m for n, m in model.named_modules() if n.endswith(".mlp.gate")]
    assert routers and all(r.quant is None and r.weight.dtype == torch.float32 for r in routers)
    got = _generate(llm)
    if name == "q4_k_m":  # the same values as llama.cpp's float32 file of them
        want = _generate(_llm(files, kind, "q4_k_m-f32"))
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
        for (_, a), (_, b) in zip(got, want):
            assert a == pytest.approx(b, abs=1e-4)
    if kind == "qwen3_moe":
        _assert_matches(got, _transformers(files, kind, name))


def test_off_the_cpu_the_experts_are_dequantized_at_load(monkeypatch, caplog, files: dict[str, Path]):
    """On CUDA the loader keeps nothing in blocks (the plan a CUDA device gets, forced here on CPU):
    the experts fill the float parameters with the file's dequantized values, and compute what the
    blocks do."""
    from tram.model import loader

    want = _generate(_llm(files, "mixtral", "q4_k_m"))
    real = loader.plan_gguf_weights
    monkeypatch.setattr(loader, "plan_gguf_weights", lambda model, path, keep_quantized: real(model, path, False))
    monkeypatch.setattr(logging.getLogger("tram"), "propagate", True)  # tram's own handler keeps it from caplog
    with caplog.at_level(logging.INFO, logger="tram.model.gguf.loader"):
        llm = _llm(files, "mixtral", "q4_k_m")
    assert "Q4_K (" in caplog.text and "Q6_K (" in caplog.text  # counted among the dequantized types
    assert _expert_types(llm) == [("float", "float")] * 2
    got = _generate(llm)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, abs=1e-4)


def test_expert_settings_as_llama_cpp_reads_them():
    """qwen3moe without `expert_feed_forward_length`: llama.cpp's feed_forward_length / experts used;
    a llama file with experts is Mixtral, one without is Llama."""
    from tram.model.gguf.archs import ARCHITECTURES, MIXTRAL, Meta, served_architecture

    fields = {"qwen3moe.expert_count": 128, "qwen3moe.expert_used_count": 8}
    extras = ARCHITECTURES["qwen3moe"].extras(Meta(fields, "qwen3moe", {}, "q.gguf"), {"intermediate_size": 6144})
    assert extras["moe_intermediate_size"] == 768 and extras["norm_topk_prob"] and extras["mlp_only_layers"] == []
    with pytest.raises(ValueError, match="q.gguf: a qwen3moe file needs qwen3moe.expert_count"):
        ARCHITECTURES["qwen3moe"].extras(Meta({}, "qwen3moe", {}, "q.gguf"), {"intermediate_size": 6144})
    assert served_architecture({"llama.expert_count": 8}, "llama") is MIXTRAL
    assert served_architecture({"llama.expert_count": 0}, "llama") is ARCHITECTURES["llama"]
    assert served_architecture({}, "llama") is ARCHITECTURES["llama"]


def test_int8_activations_reach_the_experts(files: dict[str, Path]):
    """`--gguf-activations int8`: the experts' blocks meet int8 activations too (llama.cpp's
    numerics), close to the float-activation run's logprobs."""
    path = files["qwen3_moe-q8_0"]
    llm = LLM(str(path), tokenizer=str(files["qwen3_moe"]), max_num_seqs=4, max_model_len=256, gguf_activations="int8")
    layers = _moe_layers(llm)
    assert layers and all(m.w13.int8_activations and m.w2.int8_activations for m in layers)
    assert all(view.int8_activations for view in [layers[0].w13.views()[0], layers[0].w2.views()[1]])
    got = _generate(llm)
    want = _generate(_llm(files, "qwen3_moe", "q8_0"))
    first = [logprobs[0] for _, logprobs in got], [logprobs[0] for _, logprobs in want]
    assert first[0] == pytest.approx(first[1], abs=0.05)
