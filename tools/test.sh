#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: the C++ tests
# (ctest; label gpu skips itself with a printed reason when there is no GPU), then
# the Python package's (pip install . into build/venv, pytest). One build of the C++,
# in build/pip: the Python extension's configuration (LOOM_PYTHON=ON: Abseil and
# Protobuf linked shared), which `pip install .` then reuses instead of compiling
# everything again. tools/build.sh keeps the static build in build/ (the binaries
# that travel to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
PY=${PYTHON:-python3}
[ -x build/venv/bin/python ] || "$PY" -m venv build/venv
build/venv/bin/python -m pip install -q --disable-pip-version-check nanobind scikit-build-core
cmake -S . -B build/pip -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON=ON \
  -DPython_EXECUTABLE="$PWD/build/venv/bin/python" >/dev/null
cmake --build build/pip
(cd build/pip && ctest --output-on-failure -j"$(nproc)")
bash tools/python_test.sh
