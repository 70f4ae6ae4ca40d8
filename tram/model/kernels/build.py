"""Building the C++ CPU kernels (cpu_kernels.py) with a log that tells the truth, and `tram build-kernels`.

torch.utils.cpp_extension.load compiles with g++ through ninja and prints nothing meanwhile. On a
first start that build runs inside the engine core process for minutes while the port refuses
connections, which looks like a hang. So: `tram build-kernels`
builds at set-up (scripts/setup.sh runs it), and a build that still happens at start says what it
is doing, about how long it takes here, that it is still going (every HEARTBEAT_SECONDS), and how
long it took. The engine core inherits the server's stderr, so its log lines appear there.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 15.0
# The start-up log's estimate of a fresh build of each family (families.py) on two quiet cores, and
# of its longest file, which bounds the wall time whatever the number of cores. Both grow as kernels
# are added; docs/benchmarks.md ("Set-up time") has the measured builds. A busy machine takes
# longer: the heartbeat says so.
_TWO_CORE_SECONDS = {"core": 40.0, "gguf": 60.0, "quant": 16.0, "moe": 55.0}
_LONGEST_FILE_SECONDS = {"core": 30.0, "gguf": 55.0, "quant": 14.0, "moe": 50.0}


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def expected_build_seconds(cores: int | None = None, family: str = "core") -> float:
    """About how long a family's build takes on a machine with this many cores (ninja compiles its
    files in parallel)."""
    two_cores = _TWO_CORE_SECONDS.get(family, 60.0)
    return max(_LONGEST_FILE_SECONDS.get(family, 30.0), two_cores * 2 / (cores or usable_cores()))


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


def build_with_progress(name: str, build: Callable[[], ModuleType], family: str = "core") -> ModuleType:
    """Run `build` (cpp_extension.load of `name`, a family's module), logging what happens when it is
    not just a load."""
    ensure_build_tools()
    cached = is_built(name)
    cores = usable_cores()
    what = f"the C++ CPU kernels ({family})"
    if not cached:
        logger.info(
            "Building %s (once per machine and checkout; `tram build-kernels` does it ahead): usually "
            "about %.0f s with %d core(s). Cache: %s",
            what,
            expected_build_seconds(cores, family),
            cores,
            build_directory(name),
        )
    start = time.monotonic()
    with heartbeat(f"building {what}" if not cached else f"loading {what}"):
        module = build()
    elapsed = time.monotonic() - start
    if not cached or elapsed > HEARTBEAT_SECONDS:
        logger.info("C++ CPU kernels (%s) built in %.1f s: %s", family, elapsed, module.__file__)
    return module


def build_in_parallel(families: Sequence[str]) -> None:
    """Build the families not yet in torch's cache side by side, one process each (a process: torch's
    cpp_extension.load is not meant to run in threads), their compile jobs shared out over the cores.
    Raises RuntimeError naming the families that failed, with their output."""
    from tram.model.kernels.cpu_kernels import extension_name

    todo = [family for family in families if not is_built(extension_name(family))]
    if len(todo) < 2:
        return  # one family: its own ninja already spreads it over the cores
    ensure_build_tools()
    jobs = str(max(1, usable_cores() // len(todo)))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "MAX_JOBS": jobs, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "tram.model.kernels.build", "--only"]
    with heartbeat(f"building the C++ CPU kernels ({', '.join(todo)})"):
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        runs = {family: subprocess.Popen([*command, family], env=env, **pipe) for family in todo}
        outputs = {f: run.communicate()[0].decode(errors="replace") for f, run in runs.items()}
    failed = [f for f, run in runs.items() if run.returncode != 0]
    if failed:
        raise RuntimeError("; ".join(f"the {f} kernels did not build:\n{outputs[f][-3000:]}" for f in failed))


def build_kernels_command(families: Sequence[str] | None = None) -> int:
    """`tram build-kernels [FAMILY ...]`: build (or find) the kernels now, every family unless named,
    and say where they are and how long it took."""
    from tram.model.kernels import cpu_kernels
    from tram.model.kernels.families import FAMILIES

    if not cpu_kernels.kernels_enabled():
        print(f"{cpu_kernels.ENV_SWITCH}=0: the C++ CPU kernels are switched off; nothing to build")
        return 0
    families = list(families or FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        print(f"error: no kernel family {unknown}; the families are {list(FAMILIES)}", file=sys.stderr)
        return 2
    cached = all(is_built(cpu_kernels.extension_name(f)) for f in families)
    start = time.monotonic()
    try:
        kernels = cpu_kernels.build_cpu_kernels(families)
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
    where = os.path.dirname(os.path.dirname(kernels.__file__))
    print(f"C++ CPU kernels ({', '.join(families)}) {verb} in {elapsed:.1f} s: {where}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python3 -m tram.model.kernels.build [FAMILY ...]`: `tram build-kernels`, needing only torch and
    ninja, so that scripts/setup.sh can build while pip installs the rest of Tram's dependencies.
    `--only FAMILY` builds one family quietly (build_in_parallel's worker)."""
    from tram.model.kernels.families import FAMILIES

    parser = argparse.ArgumentParser(prog="python3 -m tram.model.kernels.build")
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"of {list(FAMILIES)} (default: all)")
    parser.add_argument("--only", choices=list(FAMILIES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only:
        from tram.model.kernels.cpu_kernels import compile_family

        compile_family(args.only)
        return 0
    return build_kernels_command(args.families)


if __name__ == "__main__":
    sys.exit(main())
