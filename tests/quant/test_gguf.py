"""GGUF files made by llama.cpp's own tools, served by Tram and checked against transformers loading
the same file (`gguf_file=`, which dequantizes every tensor to float32: the oracle of what the file
means). Tram keeps Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weights in their block
layouts, so the greedy tokens must be the oracle's and logprobs within 1e-3 (float32 summation order
only: both sides use the same dequantized values, which test_gguf_weights.py checks bit for bit)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_no_leak
from gguf_tools import convert, quantize
from hf_models import STORIES_DIR, make_hf_model_dir
from quant_oracle import assert_matches_oracle as assert_matches_dequantized
from quant_oracle import oracle_continuation

from tram import LLM, SamplingParams

PROMPTS = [[1, 17, 300, 45, 9], [1, 200, 201, 202, 203, 204, 205, 206], [1, 5], [1, 99, 98, 97, 96, 95, 94]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def stories_q8_0(workdir: Path) -> Path:
    return convert(STORIES_DIR, workdir / "stories-q8_0.gguf", "q8_0")


@pytest.fixture(scope="module")
def llama_256_f32(workdir: Path) -> Path:
    """A random Llama whose rows are 256 wide (K-quants need multiples of 256) and whose LM head is
    its own (a quantized `output.weight`), as float32 GGUF."""
    folder = make_hf_model_dir(
        workdir,
        "llama_gqa",
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return convert(folder, workdir / "llama256-f32.gguf", "f32")


def _oracle(gguf: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()


def _kept_types(llm: LLM) -> dict[str, int]:
    from gguf import GGMLQuantizationType

    model = llm.llm_engine.engine_core.executor.model_runner.model
    counts: dict[str, int] = {}
    for module in model.modules():
        quant = getattr(module, "quant", None)
        if quant is not None and hasattr(quant, "ggml_type"):
            name = GGMLQuantizationType(quant.file_type).name
            counts[name] = counts.get(name, 0) + 1
    return counts


# transformers' Llama linears and the GGUF tensors they come from.
_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_tensor(module_name: str) -> str:
    if module_name == "lm_head":
        return "output.weight"
    layer, rest = module_name.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[rest]}.weight"


def _int8_activations(oracle: torch.nn.Module, gguf: Path) -> torch.nn.Module:
    """The oracle with every linear's input quantized to int8 and dequantized, as `--gguf-activations
    int8` does: per 256 values before a K-quant weight, per 32 before the others (tram's
    quantize_activations, which the kernel tests hold the C++ to)."""
    from gguf import GGUFReader

    from tram.model.gguf.weight import activation_block, dequantize_activations

    types = {t.name: int(t.tensor_type) for t in GGUFReader(str(gguf)).tensors}
    for name, module in oracle.named_modules():
        if isinstance(module, torch.nn.Linear):
            block = activation_block(types[_gguf_tensor(name)])
            module.register_forward_pre_hook(lambda m, args, b=block: (dequantize_activations(args[0], b),))
    return oracle


def assert_matches_oracle(llm: LLM, gguf: Path, prompts: list[list[int]] = PROMPTS) -> None:
    """Greedy tokens equal transformers' on the same file, chosen-token logprobs within 1e-3."""
    assert_matches_dequantized(llm, _oracle(gguf), prompts, MAX_TOKENS, ignore_eos=True)
    assert_no_leak(llm.llm_engine)


def _llm(gguf: Path, **kwargs) -> LLM:
    # 32 batched tokens: prefills of several prompts pass 16 rows (dequantize + GEMM), decodes stay
    # on the block-layout kernel.
    return LLM(str(gguf), max_num_seqs=4, max_model_len=256, max_num_batched_tokens=32, **kwargs)


def test_stories_q8_0_from_convert_hf_to_gguf(stories_q8_0: Path):
    llm = _llm(stories_q8_0)  # no tokenizer given: built from the file's own vocabulary
    # q, k, v, o, gate, up of 5 layers and the (tied) embedding; down (172 wide) stays float16 in the file.
    assert _kept_types(llm) == {"Q8_0": 5 * 6 + 1}
    assert_matches_oracle(llm, stories_q8_0)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(STORIES_DIR)
    text = "Once upon a time, Lily saw a big dog."
    assert llm.get_tokenizer().encode(text) == hf.encode(text)
    out = llm.generate([text], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert out.prompt_token_ids == hf.encode(text) and len(out.outputs[0].text) > 0


# One file per llama-quantize preset would start an engine and an oracle per type; per-tensor
# overrides put every kept type in one file instead: the K-quants, and the 32-wide types that
# llama-quantize falls back to where rows are not a multiple of 256 (Qwen2.5-0.5B's 896).
MIXED = {
    "attn_q": "q5_0",
    "attn_k": "q5_1",
    "attn_v": "q4_1",
    "attn_output": "q4_0",
    "ffn_gate": "q5_k",
    "ffn_up": "q8_0",
}


@pytest.mark.parametrize(
    "qtype,overrides,kept",
    [
        ("Q4_K_M", {}, {"Q4_K", "Q6_K"}),  # as users make them; the untied head is Q6_K
        ("Q4_K_M", MIXED, {"Q5_0", "Q5_1", "Q4_1", "Q4_0", "Q5_K", "Q8_0", "Q4_K", "Q6_K"}),
    ],
)
def test_llama_quantize_types(
    workdir: Path, llama_256_f32: Path, qtype: str, overrides: dict[str, str], kept: set[str]
):
    gguf = quantize(llama_256_f32, workdir / f"llama256-{qtype}-{len(overrides)}.gguf", qtype, overrides)
    llm = _llm(gguf, tokenizer=STORIES_DIR)
    assert kept == set(_kept_types(llm)), _kept_types(llm)
    assert_matches_oracle(llm, gguf)


def _greedy_and_logprob_gaps(llm: LLM, oracle: torch.nn.Module) -> tuple[int, list[float]]:
    """(prompts whose greedy tokens are the oracle's, |logprob - oracle's| of every chosen token)."""
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True),
        use_tqdm=False,
    )
    same, gaps = 0, []
    for p, out in zip(PROMPTS, outs):
        ids = out.outputs[0].token_ids
        want, ref = oracle_continuation(oracle, p, ids, MAX_TOKENS)
        same += ids == want
        gaps += [
            abs(row[t].logprob - ref[len(p) - 1 + i, t].item())
            for i, (t, row) in enumerate(zip(ids, out.outputs[0].logprobs))
        ]
    return same, gaps


def test_int8_activations_are_the_oracle_s_with_quantized_inputs(workdir: Path, llama_256_f32: Path):
    """--gguf-activations int8 on all eight kept types (every linear of this file, the LM head too),
    against transformers on the file with each linear's input quantized the same way (per 256 values
    before the K-quants, per 32 before the others). Tokens agree to ~1e-6 unless a float32
    summation-order difference moves one activation across a rounding boundary of its int8 grid (one
    step: 1/127 of its block's largest value), after which the KV cache carries a ~1e-2 difference
    (measured: 4/4 prompts' greedy tokens equal, all 48 logprobs within 2e-6; an earlier grid per 32
    for every type crossed such a boundary and left 23 of 48 within 1e-5, the largest gap 0.031: a
    wrong scale or quant would leave none that close). The plain float32 oracle is further away."""
    gguf = quantize(llama_256_f32, workdir / f"llama256-Q4_K_M-{len(MIXED)}.gguf", "Q4_K_M", MIXED)
    llm = _llm(gguf, tokenizer=STORIES_DIR, gguf_activations="int8")
    assert len(_kept_types(llm)) == 8
    same, gaps = _greedy_and_logprob_gaps(llm, _int8_activations(_oracle(gguf), gguf))
    assert same >= 3, same
    assert sum(g < 1e-4 for g in gaps) >= len(gaps) // 3 and max(gaps) < 0.1, gaps
    assert_no_leak(llm.llm_engine)


def test_bfloat16_is_as_near_the_oracle_as_its_own_bf16(monkeypatch, workdir: Path, llama_256_f32: Path):
    """--dtype bfloat16 on all eight kept types: prefill rows past 16 go through bf16 slabs and oneDNN
    where bf16 GEMMs are native (slab_gemm.py), decode rows through the block-layout kernel. Against
    transformers on the file in bfloat16 each side rounds its own intermediates to bf16. Measured on
    this file: 3/4 prompts' greedy tokens equal, logprob gaps median 0.014, largest 0.046; transformers'
    own bf16 against its float32 differs as much (2/4 prompts, median 0.012, largest 0.053). A wrong
    slab or weight is off by the weights' scale, not by a rounding."""
    from tram.model.gguf import weight as gguf_weight
    from tram.model.quant import slab_gemm

    gguf = quantize(llama_256_f32, workdir / f"llama256-Q4_K_M-{len(MIXED)}.gguf", "Q4_K_M", MIXED)
    rows = []
    monkeypatch.setattr(slab_gemm, "MIN_ROWS", 17)  # this test's prefills are 22 rows
    real = gguf_weight.slab_linear
    monkeypatch.setattr(gguf_weight, "slab_linear", lambda *a: rows.append(a[0].shape[0]) or real(*a))
    llm = _llm(gguf, tokenizer=STORIES_DIR, dtype="bfloat16")
    same, gaps = _greedy_and_logprob_gaps(llm, _oracle(gguf).to(torch.bfloat16))
    assert same >= 2, same
    assert max(gaps) < 0.1 and sorted(gaps)[len(gaps) // 2] < 0.03, gaps
    if slab_gemm.bf16_gemm_fast():
        assert rows and min(rows) > 16, rows  # the prefills took the bf16 path, the decodes did not
    assert_no_leak(llm.llm_engine)


def test_float32_slabs_keep_the_oracle_s_greedy_tokens(monkeypatch, workdir: Path, llama_256_f32: Path):
    """Where the kernels are built without AVX-512, float32 prefill rows past MIN_ROWS go to MKL on
    float32 slabs of the decoded weights (slab_gemm.py), forced on here for all eight kept types: the
    oracle's own computation (F.linear on the dequantized weights), so its greedy tokens hold."""
    from tram.model.gguf import weight as gguf_weight
    from tram.model.quant import slab_gemm

    gguf = quantize(llama_256_f32, workdir / f"llama256-Q4_K_M-{len(MIXED)}.gguf", "Q4_K_M", MIXED)
    rows = []
    monkeypatch.setattr(slab_gemm, "MIN_ROWS", 17)  # this test's prefills are 22 rows
    monkeypatch.setattr(slab_gemm, "float32_gemm_faster", lambda kernels: True)
    real = gguf_weight.slab_linear
    monkeypatch.setattr(gguf_weight, "slab_linear", lambda *a: rows.append((a[0].shape[0], a[0].dtype)) or real(*a))
    llm = _llm(gguf, tokenizer=STORIES_DIR)
    assert_matches_oracle(llm, gguf)
    assert rows and min(n for n, _ in rows) > 16 and {d for _, d in rows} == {torch.float32}, rows


def test_on_a_gpu_every_tensor_is_dequantized_at_load(monkeypatch, caplog, workdir: Path, llama_256_f32: Path):
    """GGUF's block kernels are CPU kernels: on CUDA the loader keeps no tensor quantized (the plan
    a CUDA device gets, forced here on CPU), so the file runs as its dequantized float model."""
    from tram.model import loader
    from tram.model.gguf.loader import check_gguf_placement

    check_gguf_placement("cuda")
    with pytest.raises(ValueError, match="GGUF files run on CPU and CUDA devices, not 'mps'"):
        check_gguf_placement("mps")
    real = loader.plan_gguf_weights
    monkeypatch.setattr(loader, "plan_gguf_weights", lambda model, path, keep_quantized: real(model, path, False))
    monkeypatch.setattr(logging.getLogger("tram"), "propagate", True)  # tram's own handler keeps it from caplog
    gguf = quantize(llama_256_f32, workdir / f"llama256-Q4_K_M-{len(MIXED)}.gguf", "Q4_K_M", MIXED)
    with caplog.at_level(logging.WARNING, logger="tram.model.gguf.loader"):
        llm = _llm(gguf, tokenizer=STORIES_DIR)
    assert "dequantized to the model's dtype at load" in caplog.text
    assert _kept_types(llm) == {}
    assert_matches_oracle(llm, gguf)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])  # Mistral files are llama files
def test_other_architectures_q8_0(workdir: Path, kind: str):
    # Qwen3 with head_dim 128: transformers' GGUF config ignores attention.key_length and keeps
    # Qwen3Config's default of 128, so the oracle loads no other (Tram reads key_length).
    folder = make_hf_model_dir(workdir, kind, **({"head_dim": 128} if kind == "qwen3" else {}))
    gguf = convert(folder, workdir / f"{kind}-q8_0.gguf", "q8_0")
    llm = _llm(gguf, tokenizer=folder)
    assert set(_kept_types(llm)) == {"Q8_0"}
    assert_matches_oracle(llm, gguf)


# ---- bad input ---------------------------------------------------------------------------------
def _assert_one_line_naming(err: Exception, path: Path) -> None:
    """What a user sees at start: one line that says which file."""
    assert str(path) in str(err) and "\n" not in str(err), str(err)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    return dst


def test_truncated_and_corrupt_files_fail_at_start(workdir: Path, stories_q8_0: Path):
    data = stories_q8_0.read_bytes()
    truncated = workdir / "truncated.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ValueError, match="truncated|not a readable GGUF") as err:
        LLM(str(truncated), tokenizer=STORIES_DIR)
    _assert_one_line_naming(err.value, truncated)
    corrupt = workdir / "corrupt.gguf"
    corrupt.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(ValueError, match="not a readable GGUF file") as err:
        LLM(str(corrupt), tokenizer=STORIES_DIR)
    _assert_one_line_naming(err.value, corrupt)


def test_unknown_tensor_type_fails_at_start(workdir: Path, stories_q8_0: Path):
    data = bytearray(stories_q8_0.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name)  # then: n_dims (u32), dims (u64 each), type (u32)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    data[type_at : type_at + 4] = (99).to_bytes(4, "little")
    bad = workdir / "unknown-type.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="unknown tensor type 99") as err:
        LLM(str(bad), tokenizer=STORIES_DIR)
    _assert_one_line_naming(err.value, bad)


def test_unsupported_architecture_fails_at_start(workdir: Path, stories_q8_0: Path):
    """A family Tram does not serve (here the file says mamba, one of llama.cpp's): one line naming the
    file, the architecture and those Tram serves."""
    data = stories_q8_0.read_bytes()
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8  # then: value type (u32), length (u64), the string
    assert data[at : at + 5] == b"llama"
    bad = workdir / "unsupported-arch.gguf"
    bad.write_bytes(data[:at] + b"mamba" + data[at + 5 :])
    with pytest.raises(
        ValueError, match="GGUF architecture 'mamba' in .* is not supported: Tram serves .*gemma3"
    ) as err:
        LLM(str(bad), tokenizer=STORIES_DIR)
    _assert_one_line_naming(err.value, bad)


def test_mismatched_tokenizer_fails_at_start(workdir: Path, stories_q8_0: Path):
    from transformers import AutoTokenizer

    bigger = AutoTokenizer.from_pretrained(STORIES_DIR)
    bigger.add_tokens([f"<extra_{i}>" for i in range(100)])  # 612 tokens for 512 embedding rows
    bigger.save_pretrained(workdir / "bigger-tokenizer")
    with pytest.raises(ValueError, match="not this model's tokenizer"):
        LLM(str(stories_q8_0), tokenizer=str(workdir / "bigger-tokenizer"))


def test_on_the_fly_quantization_of_a_gguf_file_is_refused(stories_q8_0: Path):
    with pytest.raises(ValueError, match="GGUF"):
        LLM(str(stories_q8_0), quantization="int8")


def test_tram_serve_gguf_file(stories_q8_0: Path):
    """`tram serve model.gguf`: the tokenizer and chat template come from the file, the completion is
    the offline engine's, and the API process still never loads torch (the config is read with gguf)."""
    import httpx
    from server_utils import RemoteServer, assert_idle

    llm = _llm(stories_q8_0)
    want = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    srv = RemoteServer(stories_q8_0)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
        got = httpx.post(srv.url_for("/v1/completions"), json=body, timeout=60).json()
        assert got["choices"][0]["text"] == want.outputs[0].text
        chat = {"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 8}
        reply = httpx.post(srv.url_for("/v1/chat/completions"), json=chat, timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        with open(f"/proc/{srv.proc.pid}/maps") as f:
            assert "libtorch" not in f.read()
        assert_idle(srv)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def base_q8_0(workdir: Path) -> Path:
    """stories260K without its chat template (as a base model's GGUF file is)."""
    import json

    folder = workdir / "stories-base"
    shutil.copytree(STORIES_DIR, folder, ignore=shutil.ignore_patterns("chat_template.jinja"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return convert(str(folder), workdir / "stories-base-q8_0.gguf", "q8_0")


def test_a_base_model_without_a_template_completes_and_refuses_chat(base_q8_0: Path):
    """As vLLM: completions work; chat is a ValueError offline and a 400 naming the missing template
    online, and the server goes on serving."""
    import httpx
    from server_utils import RemoteServer, assert_idle

    llm = _llm(base_q8_0)
    assert llm.generate(["Once upon a time"], SamplingParams(max_tokens=4), use_tqdm=False)[0].outputs[0].text
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": "Lily"}], SamplingParams(max_tokens=4), use_tqdm=False)
    srv = RemoteServer(base_q8_0)
    try:
        chat = {"messages": [{"role": "user", "content": "Lily"}], "max_tokens": 8}
        reply = httpx.post(srv.url_for("/v1/chat/completions"), json=chat, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert "no chat template" in error["message"] and error["param"] == "chat_template", error
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        done = httpx.post(srv.url_for("/v1/completions"), json=body, timeout=60)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 8
        assert_idle(srv)
    finally:
        srv.stop()
