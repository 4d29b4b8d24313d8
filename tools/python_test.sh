#!/usr/bin/env bash
# The Python package: `pip install .` into a virtual environment (build/venv; the
# CMake build is kept in build/pip, so a second run rebuilds only what changed),
# then its pytest suite (CPU VM; GPU cases skip with a reason without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x build/venv/bin/python ] || "$PY" -m venv build/venv
build/venv/bin/python -m pip install -q --disable-pip-version-check ".[test]"
LOOM_CLI="$PWD/build/venv/bin/loom" build/venv/bin/python -m pytest -q -p no:cacheprovider python/tests
