#!/usr/bin/env bash
# Installs Tram: what serving needs (`bash scripts/setup.sh`), or that plus the test and benchmark
# tools (`bash scripts/setup.sh --dev`). torch is pinned first: that pin resolves to a local CPU
# wheel here, while an unpinned torch would pull several GB of CUDA packages. Then the C++ CPU
# kernels are built (about 2-2.5 minutes on 2 cores, once), so that the first `tram serve` does not wait for
# them. A failed build (no g++ or ninja) does not fail the set-up: Tram then serves on its slower
# PyTorch paths, and `tram build-kernels` says what is missing (TRAM_CPU_KERNELS=0 skips the kernels).
# --dev installs under constraints-dev.txt: the exact versions of the test tools and of everything
# else the dev install pulls in that the suite last passed with, so that a new release of any of
# them cannot break the suite unannounced (refresh it as that file says).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0"
if [ "${1:-}" = "--dev" ]; then
  python3 -m pip install -q -e ".[dev]" -c constraints-dev.txt
else
  python3 -m pip install -q -e .
fi
python3 -m tram build-kernels || echo "setup: the C++ CPU kernels did not build (see above); Tram will serve without them, more slowly" >&2
