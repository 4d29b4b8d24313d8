#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. GPU tests
# (label gpu) skip themselves with a printed reason when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
cd build && ctest --output-on-failure -j"$(nproc)"
