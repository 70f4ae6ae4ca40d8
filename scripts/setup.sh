#!/usr/bin/env bash
# Installs Tram and its test dependencies. torch is pinned first: that pin resolves to a local CPU
# wheel here, while an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q -e ".[dev]"
