#!/usr/bin/env bash
# Installs Tram: what serving needs (`bash scripts/setup.sh`), or that plus the test and benchmark
# tools (`bash scripts/setup.sh --dev`). torch is pinned first: that pin resolves to a local CPU
# wheel here, while an unpinned torch would pull several GB of CUDA packages. Then the C++ CPU
# kernels every model calls (their core family, about 40 s on 2 cores, once) are built beside the
# rest of the install, so that the first `tram serve` does not wait for them; the GGUF, int8/int4
# and MoE families build on first use (or ahead: `tram build-kernels`; --dev builds them all). A
# failed build (no g++ or ninja) does not fail the set-up: Tram then serves on its slower PyTorch
# paths, and `tram build-kernels` says what is missing (TRAM_CPU_KERNELS=0 skips the kernels).
# --dev installs under constraints-dev.txt: the exact versions of the test tools and of everything
# else the dev install pulls in that the suite last passed with, so that a new release of any of
# them cannot break the suite unannounced (refresh it as that file says).
set -euo pipefail
cd "$(dirname "$0")/.."
constraints=() families=(core)
if [ "${1:-}" = "--dev" ]; then constraints=(-c constraints-dev.txt) families=(); fi
python3 -m pip install -q "torch==2.13.0" ninja "${constraints[@]}"
# The kernels need only torch, ninja and a compiler: they build while pip installs the rest.
python3 -m tram.model.kernels.build "${families[@]}" &
kernels=$!
trap 'kill "$kernels" 2>/dev/null || true' EXIT  # a failed pip install stops the build too
if [ "${1:-}" = "--dev" ]; then
  python3 -m pip install -q -e ".[dev]" "${constraints[@]}"
else
  python3 -m pip install -q -e .
fi
wait "$kernels" || echo "setup: the C++ CPU kernels did not build (see above); Tram will serve without them, more slowly" >&2
