#!/usr/bin/env bash
# Installs Tram: what serving needs (`bash scripts/setup.sh`), or that plus the test and benchmark
# tools (`bash scripts/setup.sh --dev`). torch is pinned first: that pin resolves to a local CPU
# wheel here, while an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0"
if [ "${1:-}" = "--dev" ]; then
  python3 -m pip install -q -e ".[dev]"
else
  python3 -m pip install -q -e .
fi
