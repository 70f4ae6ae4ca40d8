"""Building the C++ CPU kernels (cpu_kernels.py) with a log that tells the truth, and `tram build-kernels`.

torch.utils.cpp_extension.load compiles with g++ through ninja and prints nothing meanwhile. On a
first start that build runs inside the engine core process for minutes while the port refuses
connections, which looks like a hang. So: `tram build-kernels`
builds at set-up (scripts/setup.sh runs it), and a build that still happens at start says what it
is doing, about how long it takes here, that it is still going (every HEARTBEAT_SECONDS), and how
long it took. The engine core inherits the server's stderr, so its log lines appear there.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 15.0
# The start-up log's estimate of a fresh build: ninja spreads the files over the cores, but the
# longest one (paged_decode.cpp with its fp8 instantiations) bounds the wall time whatever their
# number. Both grow as kernels are added (the GGUF int8 kernels compile once per block type, ISA and
# tile shape); docs/benchmarks.md ("Set-up time") has the measured builds. A busy machine takes
# longer: the heartbeat says so.
_TWO_CORE_SECONDS = 140.0
_LONGEST_FILE_SECONDS = 40.0


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def expected_build_seconds(cores: int | None = None) -> float:
    """About how long a build takes on a machine with this many cores (ninja compiles in parallel)."""
    return max(_LONGEST_FILE_SECONDS, _TWO_CORE_SECONDS * 2 / (cores or usable_cores()))


def build_directory(name: str) -> str:
    """Where torch caches the extension `name` (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(name, verbose=False)


def is_built(name: str) -> bool:
    """Whether a built module is cached. torch still rebuilds it if the sources changed since."""
    return os.path.exists(os.path.join(build_directory(name), f"{name}.so"))


def ensure_build_tools() -> None:
    """RuntimeError naming what is missing. cpp_extension runs `ninja` from PATH; the pip package
    puts it beside this Python, which is off PATH when a virtual environment's `tram` runs without
    the environment activated, so that folder is added first."""
    here = os.path.dirname(sys.executable)
    if shutil.which("ninja") is None and shutil.which("ninja", path=here):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    compiler = os.environ.get("CXX", "c++")
    missing = [f"a C++ compiler ({compiler!r}; e.g. apt-get install g++)"] if shutil.which(compiler) is None else []
    if shutil.which("ninja") is None:
        missing.append("ninja (pip install ninja)")
    if missing:
        raise RuntimeError(f"cannot build the C++ CPU kernels: missing {' and '.join(missing)}")


@contextmanager
def heartbeat(what: str, every: float | None = None) -> Iterator[None]:
    """Log "still <what>, N s so far" every `every` seconds (HEARTBEAT_SECONDS) until the block ends."""
    every = every or HEARTBEAT_SECONDS
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            logger.info("still %s: %.0f s so far", what, time.monotonic() - start)

    thread = threading.Thread(target=beat, name="tram-build-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def build_with_progress(name: str, build: Callable[[], ModuleType]) -> ModuleType:
    """Run `build` (cpp_extension.load of `name`), logging what happens when it is not just a load."""
    ensure_build_tools()
    cached = is_built(name)
    cores = usable_cores()
    if not cached:
        logger.info(
            "Building the C++ CPU kernels (once per machine and checkout; `tram build-kernels` does it "
            "at set-up): usually about %.0f s with %d core(s). The server answers once they are built. "
            "Cache: %s",
            expected_build_seconds(cores),
            cores,
            build_directory(name),
        )
    start = time.monotonic()
    with heartbeat("building the C++ CPU kernels" if not cached else "loading the C++ CPU kernels"):
        module = build()
    elapsed = time.monotonic() - start
    if not cached or elapsed > HEARTBEAT_SECONDS:
        logger.info("C++ CPU kernels built in %.1f s: %s", elapsed, module.__file__)
    return module


def build_kernels_command() -> int:
    """`tram build-kernels`: build (or find) the kernels now and say where they are and how long it took."""
    from tram.model.kernels import cpu_kernels

    if not cpu_kernels.kernels_enabled():
        print(f"{cpu_kernels.ENV_SWITCH}=0: the C++ CPU kernels are switched off; nothing to build")
        return 0
    name = cpu_kernels.extension_name()
    cached = is_built(name)
    start = time.monotonic()
    try:
        module = cpu_kernels.build_cpu_kernels()
    except Exception as e:  # noqa: BLE001 - a compiler error, missing tools: all end in one message
        print(f"error: {e}".rstrip(), file=sys.stderr)
        print(
            f"error: the C++ CPU kernels could not be built. Install g++ and ninja, or set "
            f"{cpu_kernels.ENV_SWITCH}=0 to serve with the slower PyTorch paths.",
            file=sys.stderr,
        )
        return 1
    elapsed = time.monotonic() - start
    verb = "were already built; loaded" if cached else "built"
    print(f"C++ CPU kernels {verb} in {elapsed:.1f} s: {module.__file__}")
    return 0
