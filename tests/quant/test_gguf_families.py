"""Each model family served from the GGUF file llama.cpp's converter writes for it (convert_hf_to_gguf.py
from a tiny random Hugging Face model of the family), against transformers: greedy tokens identical,
chosen-token logprobs within 1e-3.

The oracle, per family:
  * float32 files: the original Hugging Face folder. The f32 conversion is lossless (Gemma's norms
    come back from w + 1 to within a float32 rounding), and each random model uses only settings the
    file can say (Gemma's layer pattern and query scale as llama.cpp fixes them, SmolLM3's RoPE-less
    layer every 4th). transformers' own `gguf_file=` loading is no oracle for most of these families:
    it supports gemma2, gemma3, phi3 and llama only, and on those drops what the file says beyond
    Llama's keys (measured: Gemma 3's local RoPE base becomes 10000, its linear scaling and query
    scale 256 vanish; Gemma 2's soft-caps become 50 and 30; Phi-3's partial rotary and LongRoPE
    factors are lost);
  * Mistral (written as llama, which transformers reads in full): transformers on the same file;
  * the quantized files (Gemma 3 and Phi-4-mini, q8_0): transformers on the same file, dequantized,
    with the config Tram reads from it (transformers' own reading drops their settings, above).

The converter runs once per module for every family (one process: its imports take seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_no_leak
from gguf_real_models import GEMMA3_270M_SHA256, cached_json, gemma3_270m
from gguf_tools import convert_batch, convert_script
from hf_models import KINDS, make_hf_model_dir
from quant_oracle import assert_matches_oracle

from tram import LLM, SamplingParams

PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206], [1, 5], [1, 99, 98, 97, 96, 95, 94]]
MAX_TOKENS = 12


@dataclass(frozen=True)
class Family:
    """A random model of `kind` (tests/hf_models.py) with `overrides`, served as Tram's `hf_class`
    from the file the converter writes as `arch`."""

    kind: str
    arch: str
    hf_class: str
    overrides: dict[str, Any] = field(default_factory=dict)
    outtype: str = "f32"


_GEMMA3 = dict(
    num_hidden_layers=6,
    layer_types=None,  # transformers' default: 5 sliding layers then a global one, as llama.cpp assumes
    query_pre_attn_scalar=32,  # head_dim: what llama.cpp scales by (the file has no key for it)
    final_logit_softcapping=10.0,
)
FAMILIES: dict[str, Family] = {
    "gemma3": Family("gemma3", "gemma3", "Gemma3ForCausalLM", _GEMMA3),
    "gemma3_q8_0": Family("gemma3", "gemma3", "Gemma3ForCausalLM", _GEMMA3, "q8_0"),
    "mistral": Family("mistral", "llama", "MistralForCausalLM", dict(sliding_window=None)),
    "gemma2": Family(
        "gemma2",
        "gemma2",
        "Gemma2ForCausalLM",
        dict(
            num_hidden_layers=3,
            layer_types=None,  # alternating from a sliding layer, as llama.cpp assumes
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=5,
            # The converter writes no RoPE base for Gemma 2; llama.cpp's default is Gemma 2's own.
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attn_logit_softcapping=20.0,
            final_logit_softcapping=10.0,
        ),
    ),
    "phi3": Family("phi3", "phi3", "Phi3ForCausalLM"),
    # Partial rotary (12 of 16 dims) and LongRoPE, whose factors the file holds as tensors.
    "phi4_mini": Family("phi4_mini", "phi3", "Phi3ForCausalLM"),
    # The fused tensors' Q8_0 rows cut into q, k, v and gate, up, each kept in its blocks.
    "phi4_mini_q8_0": Family("phi4_mini", "phi3", "Phi3ForCausalLM", outtype="q8_0"),
    # llama.cpp leaves RoPE out of every 4th layer: the 4th of 4 here.
    "smollm3": Family("smollm3", "smollm3", "SmolLM3ForCausalLM", dict(num_hidden_layers=4, no_rope_layer_interval=4)),
    "granite": Family(
        "granite",
        "granite",
        "GraniteForCausalLM",
        dict(embedding_multiplier=12.0, attention_multiplier=0.1, residual_multiplier=0.22, logits_scaling=8.0),
    ),
    "olmo2": Family("olmo2", "olmo2", "Olmo2ForCausalLM"),
}
# Converted and read, not served.
METADATA_ONLY: dict[str, Family] = {
    "mistral_window": Family("mistral", "llama", "MistralForCausalLM", dict(sliding_window=8)),
}
# The converter's OLMo 2 class reads a GPT-2 BPE vocabulary and refuses the random models'
# sentencepiece tokenizer (gguf_tools.convert_batch has it written the Llama way).
_SENTENCEPIECE_VOCAB = ("Olmo2ForCausalLM",)


def _registered() -> set[str]:
    from tram.model.registry import supported_architectures

    return set(supported_architectures())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """family -> (its Hugging Face folder, its GGUF file), for every family whose kind and class exist."""
    root = tmp_path_factory.mktemp("gguf_families")
    convert_script()  # skips where llama.cpp's converter is missing, before any model is written
    ready = {name: f for name, f in FAMILIES.items() if f.kind in KINDS and f.hf_class in _registered()}
    ready |= {name: f for name, f in METADATA_ONLY.items() if f.kind in KINDS}
    folders = {(f.kind, json.dumps(f.overrides, sort_keys=True)) for f in ready.values()}
    made = {
        key: make_hf_model_dir(root / f"{key[0]}_{i}", key[0], **json.loads(key[1])) for i, key in enumerate(folders)
    }
    out = {
        name: (made[(f.kind, json.dumps(f.overrides, sort_keys=True))], root / f"{name}.gguf")
        for name, f in ready.items()
    }
    convert_batch([(folder, ready[name].outtype, gguf) for name, (folder, gguf) in out.items()], _SENTENCEPIECE_VOCAB)
    return out


def _family_files(files: dict[str, tuple[str, Path]], name: str) -> tuple[str, Path]:
    family = FAMILIES.get(name) or METADATA_ONLY[name]
    if name not in files:
        missing = family.kind if family.kind not in KINDS else family.hf_class
        pytest.skip(f"{missing} is not in Tram yet (tests/hf_models.py KINDS, tram/model/registry.py)")
    return files[name]


def _llm(gguf: Path, folder: str) -> LLM:
    # 32 batched tokens: the four prompts prefill in two steps, then decode together.
    return LLM(str(gguf), tokenizer=folder, max_num_seqs=4, max_model_len=256, max_num_batched_tokens=32)


def _oracle(name: str, folder: str, gguf: Path) -> torch.nn.Module:
    import transformers

    from tram.model.gguf.file import load_gguf_config

    if name == "mistral":
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        ).eval()
    if FAMILIES[name].outtype != "f32":
        config = load_gguf_config(str(gguf))
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, config=config, dtype=torch.float32
        ).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# Config entries a GGUF file does not carry, or carries under another name, or that differ by design.
_NOT_IN_FILE = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"}


def _assert_config_is_the_folder_s(name: str, folder: str, gguf: Path) -> None:
    """Every setting of the original config that Tram's reading of the file sets equals the original."""
    import transformers

    from tram.model.gguf.file import load_gguf_config

    want = transformers.AutoConfig.from_pretrained(folder).to_dict()
    got = load_gguf_config(str(gguf)).to_dict()
    diffs = {k: (v, got.get(k)) for k, v in want.items() if k not in _NOT_IN_FILE and got.get(k) != v}
    assert not diffs, f"{name}: (original, from the GGUF file) {diffs}"


def _kept_types(llm: LLM) -> list[str]:
    """The GGUF type of every weight kept in its blocks."""
    from gguf import GGMLQuantizationType

    model = llm.llm_engine.engine_core.executor.model_runner.model
    quants = [getattr(m, "quant", None) for m in model.modules()]
    return [GGMLQuantizationType(q.file_type).name for q in quants if hasattr(q, "ggml_type")]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_served_from_the_converter_s_gguf(files: dict[str, tuple[str, Path]], name: str):
    folder, gguf = _family_files(files, name)
    from tram.model.gguf.file import load_gguf_config

    config = load_gguf_config(str(gguf))
    assert config.architectures == ["LlamaForCausalLM" if name == "mistral" else FAMILIES[name].hf_class]
    if name != "mistral":  # the Mistral file has no window: see test_mistral_window_is_not_in_the_file
        _assert_config_is_the_folder_s(name, folder, gguf)
    llm = _llm(gguf, folder)
    if FAMILIES[name].outtype == "q8_0":
        # q, k, v, o, gate, up, down of each layer and the tied embedding stay in their Q8_0 blocks.
        assert _kept_types(llm) == ["Q8_0"] * (config.num_hidden_layers * 7 + 1)
    assert_matches_oracle(llm, _oracle(name, folder, gguf), PROMPTS, MAX_TOKENS, ignore_eos=True)
    assert_no_leak(llm.llm_engine)


def test_mistral_window_is_not_in_the_file(files: dict[str, tuple[str, Path]]):
    """The converter writes Mistral as llama (its LlamaModel class) and no sliding window, and llama.cpp
    runs every layer in full: so does Tram. Mistral 7B v0.1 (window 4096 of a 32k context) served from
    GGUF then differs from its Hugging Face checkpoint past 4096 tokens, as it does in llama.cpp;
    v0.2 and later have no window."""
    from tram.model.gguf.file import load_gguf_config
    from tram.model.gguf.reader import GGUFFile

    _, gguf = _family_files(files, "mistral_window")
    assert not [k for k in GGUFFile(str(gguf)).fields if "sliding_window" in k]
    config = load_gguf_config(str(gguf))
    assert config.architectures == ["LlamaForCausalLM"] and getattr(config, "sliding_window", None) is None


def test_layer_pattern_as_llama_cpp_reads_it():
    """`attention.sliding_window_pattern` as a bool per layer or a period; absent, the family's period."""
    from tram.model.gguf.archs import FULL, SLIDING, Meta, layer_types

    def meta(pattern: Any = None) -> Meta:
        fields = {} if pattern is None else {"gemma3.attention.sliding_window_pattern": pattern}
        return Meta(fields, "gemma3", {}, "m.gguf")

    assert layer_types(meta(), 7, 512, 6) == [SLIDING] * 5 + [FULL, SLIDING]
    assert layer_types(meta(2), 3, 512, 6) == [SLIDING, FULL, SLIDING]
    assert layer_types(meta([False, True]), 2, 512, 6) == [FULL, SLIDING]
    assert layer_types(meta(2), 2, None, 6) == [FULL, FULL]  # no window: every layer global
    with pytest.raises(ValueError, match="m.gguf: gemma3.attention.sliding_window_pattern has 1 entries for 2 layers"):
        layer_types(meta([True]), 2, 512, 6)


def test_family_defaults_are_llama_cpp_s():
    """Settings the converter leaves out mean what llama.cpp assumes: Gemma's query scale (head_dim;
    hidden / heads in the 27B models), Gemma 2's window and soft-caps, Granite's attention scale; a
    Phi window past the context is none."""
    from tram.model.gguf.archs import ARCHITECTURES, Meta

    common = dict(num_hidden_layers=46, hidden_size=4608, num_attention_heads=32, head_dim=128)
    gemma2 = ARCHITECTURES["gemma2"].extras(Meta({}, "gemma2", {}, "g.gguf"), common)
    assert (gemma2["query_pre_attn_scalar"], gemma2["sliding_window"]) == (144, 4096)
    assert (gemma2["attn_logit_softcapping"], gemma2["final_logit_softcapping"]) == (50.0, 30.0)
    gemma3 = ARCHITECTURES["gemma3"].extras(Meta({}, "gemma3", {}, "g.gguf"), {**common, "rope_parameters": {}})
    assert gemma3["query_pre_attn_scalar"] == 128 and gemma3["sliding_window"] is None
    granite = ARCHITECTURES["granite"].extras(Meta({}, "granite", {}, "g.gguf"), common)
    assert granite["attention_multiplier"] == 128**-0.5 and granite["logits_scaling"] == 1.0
    phi = dict(head_dim=96, max_position_embeddings=131072, rope_parameters={"rope_theta": 10000.0})
    for window, want in ((262144, None), (2047, 2047), (0, None)):  # Phi-3.5-mini, Phi-3-mini-4k, Phi-4
        meta = Meta({"phi3.attention.sliding_window": window}, "phi3", {}, "p.gguf")
        assert ARCHITECTURES["phi3"].extras(meta, phi)["sliding_window"] == want
    with pytest.raises(ValueError, match="o.gguf is an OLMo 3 file"):
        ARCHITECTURES["olmo2"].extras(Meta({"olmo2.attention.sliding_window": 4096}, "olmo2", {}, "o.gguf"), common)


def test_real_gemma3_270m_q4_k_m():
    """Gemma 3 270M as users download it: llama.cpp's Q4_K_M file (Q4_K, Q5_0, Q6_K and Q8_0 tensors;
    no local RoPE base key, from an older converter), shipped by packages on the index
    (tests/gguf_real_models.py), served with the tokenizer the file holds. transformers reads this
    file's config right (every setting is one of its Gemma 3 defaults), so it is the oracle in full.
    Teacher-forced: greedy tokens are the oracle's argmax after the same prefix, which is what greedy
    generation compares."""
    from tram.model.gguf.archs import FULL, SLIDING
    from tram.model.gguf.file import load_gguf_config

    path = gemma3_270m()
    config = load_gguf_config(str(path))
    shape = (config.hidden_size, config.num_hidden_layers, config.head_dim, config.query_pre_attn_scalar)
    assert shape == (640, 18, 256, 256)
    assert config.sliding_window == 512 and config.layer_types == ([SLIDING] * 5 + [FULL]) * 3
    assert config.rope_parameters == {
        FULL: {"rope_type": "default", "rope_theta": 1e6},
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    }
    llm = LLM(str(path), max_num_seqs=2, max_model_len=128, max_num_batched_tokens=64)
    assert set(_kept_types(llm)) == {"Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    prompts = [llm.get_tokenizer().encode(text) for text in ("The capital of France is", "def fibonacci(n):")]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1)
    outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    assert_no_leak(llm.llm_engine)
    sequences = [p + list(out.token_ids) for p, out in zip(prompts, outs)]
    want = _real_oracle(path, sequences)
    for p, out, (argmax, logprobs) in zip(prompts, outs, want):
        assert list(out.token_ids) == argmax[len(p) - 1 :], (p, out.token_ids)
        for i, (tid, row) in enumerate(zip(out.token_ids, out.logprobs)):
            assert row[tid].logprob == pytest.approx(logprobs[len(p) - 1 + i], abs=1e-3)


def _real_oracle(path: Path, sequences: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """transformers on the file, per sequence: the argmax after each prefix, and the log-probability
    of the token that follows it (cached: see tests/gguf_real_models.py)."""
    import transformers

    def compute() -> list[tuple[list[int], list[float]]]:
        oracle = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
        result = []
        for seq in sequences:
            with torch.no_grad():
                ref = torch.log_softmax(oracle(torch.tensor([seq])).logits[0, :-1].float(), dim=-1)
            chosen = ref.gather(1, torch.tensor(seq[1:]).unsqueeze(1)).squeeze(1)
            result.append((ref.argmax(dim=-1).tolist(), chosen.tolist()))
        return result

    key = [GEMMA3_270M_SHA256, transformers.__version__, torch.__version__, sequences]
    return [tuple(item) for item in cached_json(key, compute)]
