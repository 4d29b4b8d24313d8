#!/usr/bin/env bash
# The device calls that measure attn_red_in_k.patch + ring_pages_rule.patch and attention_reduce_heads
# (docs/open_work.md), through the device tool with `carry: [".carry/all.tar.xz"]`, after building here (~10 min,
# then ~4):
#
#   bash tools/build.sh && mkdir -p .carry/m && cp build/tools/loom_bench .carry/m/
#   git apply docs/experiments/attn_red_in_k.patch && git apply docs/experiments/ring_pages_rule.patch
#   cmake --build build && mkdir -p .carry/p && cp build/tools/loom_bench build/tools/loom build/tests/gpu_test .carry/p/
#   cp tools/bench_options/eleven_pages.pbtxt .carry/p/ && git checkout -- . && git clean -fq tools/bench_options
#   tar cJf /tmp/all.tar.xz .carry/m .carry/p && mv /tmp/all.tar.xz .carry/all.tar.xz   # ~13 MB (.carry/: ignored)
#
# `bash docs/experiments/red_in_k_call.sh check` (~4 min): the patched gpu_test, then `--check` against the op-by-op
# oracle on a 2-layer TinyLlama with a 300-token prompt (the oracle takes ~40 s a run on one CPU core): the rule's 12
# pages with and without the prefill pass, 11 pages, reduces of one head.
# `bash docs/experiments/red_in_k_call.sh ab` (~6 min): decode_ab on TinyLlama and 1B at 128 / 1024: main; the
# patches (TinyLlama 12 pages, 1B as before); the patches with 11 pages; main with reduces of one head (21 splits
# pinned) and of two (the split rule's choice). Writes $OUT/ab.txt.
# Two calls: together they come near one call's 10 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar xJf .carry/all.tar.xz || exit 1
S=tests/data/hf_configs/transformers5
O=tools/bench_options
M=.carry/m
P=.carry/p
case "${1:-}" in
  check)
    "$P/gpu_test" 2>&1 | tail -3
    python3 - "$S/tinyllama-1.1b.json" /tmp/tl2.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
    prompt=$(seq -s, 1 300)
    for run in "default --prefill=true" "default --prefill=false" "$P/eleven_pages.pbtxt --prefill=false" \
               "$O/reduce_heads_1.pbtxt --prefill=false"; do
      set -- $run
      options=$([ "$1" = default ] || echo "--options=$1")
      echo "--check $run: $("$P/loom" run --model=random:/tmp/tl2.json --backend=gpu --check --tokens=8 \
        --max_seq=2048 "$2" --prompt="$prompt" $options 2>&1 | tail -1)"
    done
    ;;
  ab)
    PYTHONUNBUFFERED=1 python3 tools/decode_ab.py "main=$M/loom_bench" "red=$P/loom_bench" \
      "red11=$P/loom_bench --options=$P/eleven_pages.pbtxt" \
      "rh1=$M/loom_bench --options=$O/reduce_heads_1_splits_21.pbtxt" \
      "rh2=$M/loom_bench --options=$O/reduce_heads_2.pbtxt" \
      --rounds 2 --contexts 128,1024 --models "random:$S/tinyllama-1.1b.json,random:llama-3.2-1b" | tee "$OUT/ab.txt"
    ;;
  *)
    echo "usage: $0 check|ab" >&2
    exit 2
    ;;
esac
