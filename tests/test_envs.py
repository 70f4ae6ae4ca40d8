"""tram/envs.py declares every environment variable Tram, its tests and benchmarks read, README.md
lists them all, and a value is read when asked for (tests and spawned processes change the
environment after import)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tram.envs as envs

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"TRAM_[A-Z0-9_]+")


def _variable_names_in_code() -> set[str]:
    """String literals that are exactly a TRAM_* name: os.environ.get("TRAM_X"), setenv, env dicts."""
    found = set()
    for folder in ("tram", "tests", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                    found.add(node.value)
    return found


def test_every_variable_in_the_code_is_declared() -> None:
    missing = sorted(_variable_names_in_code() - envs.VARIABLES.keys())
    assert not missing, f"declare these in tram/envs.py (default and meaning): {missing}"


def test_readme_lists_every_variable() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", section, re.MULTILINE))
    assert listed == envs.VARIABLES.keys()


def test_values_are_read_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAM_CPU_KERNELS", "0")
    assert envs.TRAM_CPU_KERNELS is False
    monkeypatch.setenv("TRAM_CPU_KERNELS", " ")  # empty counts as unset
    assert envs.TRAM_CPU_KERNELS is True
    monkeypatch.delenv("TRAM_SERVER_DEV_MODE", raising=False)
    assert envs.TRAM_SERVER_DEV_MODE is False
    monkeypatch.setenv("TRAM_SERVER_DEV_MODE", "1")
    assert envs.TRAM_SERVER_DEV_MODE is True
    assert envs.read("TRAM_CPU_THREADS", {"TRAM_CPU_THREADS": " 3 "}) == "3"
    assert envs.read("TRAM_CPU_THREADS", {}) is None
    with pytest.raises(AttributeError):
        envs.TRAM_NO_SUCH_VARIABLE  # noqa: B018
