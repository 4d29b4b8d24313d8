#!/usr/bin/env bash
# The main job: a Llama decode. On a GPU: random:llama-3.2-1b through the
# megakernel. Without one: compile the 1B schedule, simulate it, and decode
# random:tiny on the CPU reference VM, checked against the op-by-op oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
LOOM=build/tools/loom
mkdir -p out
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  $LOOM run --model=random:llama-3.2-1b --backend=gpu --tokens=128 --prompt=128000,9906,11,1917
else
  echo "no GPU: compiling and simulating the Llama-3.2-1B schedule, decoding random:tiny on the CPU VM"
  $LOOM compile --model=random:llama-3.2-1b --out=out/llama-3.2-1b.pb
  $LOOM inspect out/llama-3.2-1b.pb
  $LOOM run --model=random:tiny --backend=cpu --tokens=32 --prompt=1,2,3 --check
fi
