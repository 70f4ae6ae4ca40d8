"""Running Triton kernel modules under Triton's interpreter on CPU tensors, whatever the process did first.

Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function (for triton.language's own
functions: when triton is first imported) and again while launching. To be independent of whatever
imported triton or a kernel module before a test file (torch._dynamo imports triton, and a GPU run
may set TRITON_INTERPRET=0), `load_interpreted` executes a private copy of the kernel module with the
variable set and restores it for the rest of the process; `interpreter_on` sets it again for one
test and, where needed, swaps interpreted twins in for triton.language's jit functions.

On a GPU machine with TRITON_INTERPRET=0 (scripts/gpu_check.sh), the same tests run the compiled
kernels instead: `load_interpreted` imports the real module and `interpreter_on` makes CUDA torch's
default device, so the tests' tensors (and their references) are made on the GPU unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def on_device() -> bool:
    """Whether the Triton tests run compiled on a GPU rather than interpreted on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()


def load_interpreted(name: str, relative_path: str) -> ModuleType:
    """A private copy of the module at REPO/relative_path, its kernels built for the interpreter
    (on a GPU machine with TRITON_INTERPRET=0: the module itself, compiled)."""
    if on_device():
        return importlib.import_module(relative_path.removesuffix(".py").replace("/", "."))
    if name in sys.modules:
        return sys.modules[name]
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module


def interpreter_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRITON_INTERPRET=1 for one test (Triton also reads it while launching), and interpreted twins
    of triton.language's jit functions (tl.max, tl.sum, their combine functions) where triton was
    imported before the variable was set: those were built for the compiler and refuse to run inside
    interpreted kernels. One twin per function, so the interpreter's identity checks still hold."""
    if on_device():
        torch.set_default_device("cuda")  # conftest's autouse fixture puts it back after the test
        generator = torch.Generator  # the tests' seeded CPU generators cannot feed CUDA factories
        monkeypatch.setattr(torch, "Generator", lambda device=None: generator(device or "cuda"))
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    twins: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "triton.language" or name.startswith("triton.language.")):
            for attr, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    monkeypatch.setattr(module, attr, twins.setdefault(id(value), InterpretedFunction(value.fn)))
