#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: the C++ tests
# (ctest; label gpu skips itself with a printed reason when there is no GPU), then
# the Python package's (pip install . into build/venv, pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")
bash tools/python_test.sh
