#!/usr/bin/env bash
# Installs what Loom's build needs from Debian, when it is missing. Needs root
# (or sudo). The CUDA toolkit is expected at /usr/local/cuda (nvcc 13).
set -euo pipefail
packages=(cmake ninja-build g++ libabsl-dev libprotobuf-dev protobuf-compiler libgtest-dev nlohmann-json3-dev
          libonnx-dev libonnx-testdata)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Python package (tools/python_test.sh) builds in a virtual environment: python3 with venv and pip.
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
  echo "installing: python3-venv python3-pip"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "error: the CUDA toolkit (nvcc) is not at /usr/local/cuda" >&2
  exit 1
fi
