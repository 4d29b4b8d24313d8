#!/usr/bin/env bash
# The thirtieth session's device calls (docs/open_work.md "The next session's first call"), through the device tool
# with `carry: [".carry/next.tar.xz"]`, after building here:
#
#   bash tools/build.sh && mkdir -p .carry/m && cp build/tools/{loom,loom_bench} build/tests/{gpu_test,gpu_debug_test} .carry/m/
#   git apply docs/experiments/norm_scale_in_epilogue.patch && cmake --build build   # ~4 min (megakernel.cu)
#   mkdir -p .carry/n && cp build/tools/{loom,loom_bench} build/tests/gpu_test .carry/n/ && git checkout -- megakernel
#   tar cJf /tmp/next.tar.xz .carry/m .carry/n && mv /tmp/next.tar.xz .carry/next.tar.xz   # ~19 MB
#
# `check` (~2 min): the patched gpu_test and --check (2-layer TinyLlama, 300-token prompt, prefill on and off).
# `ab` (~5 min): decode_ab main / norm / rh1 (main with reduces of one head) on TinyLlama, 1B, Qwen2.5-0.5B at
# 128 / 1024, three rounds.
# `sweep m|n` (~6 min): TinyLlama at 1024 three times with its floor, the four-shape sweep, torch.compile on 1B,
# gpu_debug_test, hf_matrix's ten usual entries (main's binaries, or the patch's once it has landed: rebuild them).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -x .carry/m/loom ] || tar xJf .carry/next.tar.xz || exit 1
S=tests/data/hf_configs/transformers5
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  check)
    .carry/n/gpu_test 2>&1 | grep -E "^\[  (FAILED|PASSED) |Failure" | head -20
    python3 - "$S/tinyllama-1.1b.json" /tmp/tl2.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 2; json.dump(c, open(sys.argv[2], "w"))
PY
    p=$(seq -s, 1 300)
    for prefill in true false; do
      ( echo "--check prefill=$prefill: $(.carry/n/loom run --model=random:/tmp/tl2.json --backend=gpu --check --tokens=8 \
          --max_seq=2048 --prefill=$prefill --prompt="$p" 2>&1 | tail -1)" > "/tmp/check_$prefill.txt" ) &
    done
    wait
    cat /tmp/check_*.txt
    ;;
  ab)
    PYTHONUNBUFFERED=1 python3 tools/decode_ab.py main=.carry/m/loom_bench norm=.carry/n/loom_bench \
      "rh1=.carry/m/loom_bench --options=tools/bench_options/reduce_heads_1.pbtxt" --rounds 3 \
      --contexts 128,1024 --models "random:$S/tinyllama-1.1b.json,random:llama-3.2-1b,random:$S/qwen2.5-0.5b.json" \
      | tee "$OUT/ab.txt"
    ;;
  sweep)
    B=.carry/${2:-m}
    for i in 1 2 3; do
      "$B/loom_bench" --model=random:$S/tinyllama-1.1b.json --contexts=1024 --repeats=3 2>&1 | grep -E "floor|^\s+1024\s"
    done
    "$B/loom_bench" --models=random:$S/tinyllama-1.1b.json,random:llama-3.2-1b,random:$S/llama-3.2-3b.json,random:$S/llama-3.1-8b.json \
      --contexts=128,1024 --repeats=3 > "$OUT/sweep.txt" 2>&1
    sed -n '/^sweep/,$p' "$OUT/sweep.txt"
    "$B/loom" export --model=random:llama-3.2-1b --out=/tmp/l1b > /dev/null && \
      python3 tools/torch_baseline.py --model /tmp/l1b --contexts 128,1024 --tokens 128 2>&1 | tail -2
    [ -x "$B/gpu_debug_test" ] && "$B/gpu_debug_test" 2>&1 | tail -1
    PYTHONUNBUFFERED=1 timeout 240 python3 tools/hf_matrix.py --loom "$B/loom" --only smollm2-135m,tinyllama-1.1b,llama-3.2-1b,qwen2.5-0.5b,qwen3-0.6b,llama-biases,llama-linear-rope,qwen2.5-yarn,mistral-window,qwen3-bias-960 2>/dev/null | tail -2
    ;;
  *)
    echo "usage: $0 check|ab|sweep [m|n]" >&2
    exit 2
    ;;
esac
