"""llama.cpp's own tools for the GGUF tests: `convert_hf_to_gguf.py` (from the llama.cpp source that
benchmarks/llama_cpp_peer.py downloads) and `llama-quantize` (which it builds). Both live in its
cache (~/.cache/tram/llama.cpp, or TRAM_LLAMA_CPP_CACHE), outside the repository; where they are
missing the tests that need them skip and say how to get them (.ci/run builds them first)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("TRAM_LLAMA_CPP_CACHE", Path.home() / ".cache" / "tram" / "llama.cpp"))
GET_TOOLS = "python3 benchmarks/llama_cpp_peer.py build"


def convert_script() -> Path:
    found = sorted(
        glob.glob(str(CACHE / "src" / "llama_cpp_python-*" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"))
    )
    if not found:
        pytest.skip(f"llama.cpp's convert_hf_to_gguf.py is not in {CACHE} (run `{GET_TOOLS}`)")
    return Path(found[-1])


def quantize_binary() -> Path:
    binary = CACHE / "build" / "bin" / "llama-quantize"
    if not binary.exists():
        pytest.skip(f"llama-quantize is not built in {CACHE} (run `{GET_TOOLS}`)")
    return binary


def convert(model_dir: str, out: Path, outtype: str) -> Path:
    """model_dir (a Hugging Face folder) as a GGUF file of `outtype` (f32, f16, q8_0, ...)."""
    subprocess.run(
        [sys.executable, str(convert_script()), model_dir, "--outtype", outtype, "--outfile", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def quantize(src: Path, out: Path, qtype: str, overrides: dict[str, str] | None = None) -> Path:
    """llama-quantize src -> out (Q4_K_M, Q6_K, ...), with per-tensor type overrides (attn_q=q5_0);
    llama.cpp picks another type per tensor where a row is not a multiple of the type's block size."""
    extra = [arg for name, kind in (overrides or {}).items() for arg in ("--tensor-type", f"{name}={kind}")]
    subprocess.run([str(quantize_binary()), *extra, str(src), str(out), qtype], check=True, capture_output=True)
    return out


def dequantize(src: Path, out: Path) -> Path:
    """src with every quantized tensor widened to float32 by llama.cpp itself (llama-quantize's F32
    target): the values the quantized file means, as a float file."""
    subprocess.run(
        [str(quantize_binary()), "--allow-requantize", str(src), str(out), "F32"], check=True, capture_output=True
    )
    return out


# The converter reads a GPT-2 BPE vocabulary for some classes (Qwen's, OLMo 2's) and refuses one whose
# pre-tokenizer it does not recognise; the random models carry stories260K's sentencepiece tokenizer,
# so `convert_batch` has those classes write it the Llama way. Weights and metadata are untouched.
_BATCH = """
import json, runpy, sys
script, jobs, sentencepiece = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, script.rsplit("/", 1)[0])
converter = runpy.run_path(script, run_name="tram_batch")
for name in sentencepiece:
    converter["get_model_class"](name).set_vocab = lambda self: self._set_vocab_sentencepiece()
for folder, outtype, out in jobs:
    sys.argv = [script, folder, "--outtype", outtype, "--outfile", out]
    converter["main"]()
"""


def convert_batch(jobs: list[tuple[str, str, Path]], sentencepiece_vocab: tuple[str, ...] = ()) -> None:
    """Each (Hugging Face folder, outtype, out file) converted in one process (the converter's imports
    take seconds); classes named in sentencepiece_vocab (`Qwen3MoeForCausalLM`) write the folder's
    sentencepiece tokenizer."""
    import json

    args = [(folder, outtype, str(out)) for folder, outtype, out in jobs]
    done = subprocess.run(
        [sys.executable, "-c", _BATCH, str(convert_script()), json.dumps(args), json.dumps(list(sentencepiece_vocab))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
