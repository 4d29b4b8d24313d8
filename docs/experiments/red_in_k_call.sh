#!/usr/bin/env bash
# The device call that measures attn_red_in_k.patch + ring_pages_rule.patch and attention_reduce_heads
# (docs/open_work.md): run through the device tool as `bash docs/experiments/red_in_k_call.sh` with
# `carry: [".carry/all.tar.xz"]`, after building here (~10 min, then ~3):
#
#   bash tools/build.sh && mkdir -p .carry/m && cp build/tools/loom_bench .carry/m/
#   git apply docs/experiments/attn_red_in_k.patch docs/experiments/ring_pages_rule.patch && cmake --build build
#   mkdir -p .carry/p && cp build/tools/loom_bench build/tools/loom build/tests/gpu_test .carry/p/
#   cp tools/bench_options/eleven_pages.pbtxt .carry/p/ && git checkout -- . && git clean -fq tools/bench_options
#   tar cJf /tmp/all.tar.xz .carry/m .carry/p && mv /tmp/all.tar.xz .carry/all.tar.xz   # ~13 MB (.carry/: ignored)
#
# Checks first (the patched gpu_test, then `--check` on a 2-layer TinyLlama with a 300-token prompt, prefill on and
# off, with the rule's 12 pages and with 11), then decode_ab on TinyLlama and 1B at 128 / 1024: main; the patches
# (TinyLlama 12 pages, 1B as before); the patches with 11 pages; main with reduces of one head (21 splits pinned) and
# of two (the split rule's choice). Writes $OUT/ab.txt. About 8 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
tar xJf .carry/all.tar.xz || exit 1
S=tests/data/hf_configs/transformers5
O=tools/bench_options
M=.carry/m
P=.carry/p
"$P/gpu_test" 2>&1 | tail -3
python3 - "$S/tinyllama-1.1b.json" /tmp/tl2.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
prompt=$(seq -s, 1 300)
for options in "" "--options=$P/eleven_pages.pbtxt" "--options=$O/reduce_heads_1.pbtxt"; do
  for prefill in true false; do
    echo "--check ${options:-default} prefill=$prefill: $("$P/loom" run --model=random:/tmp/tl2.json --backend=gpu \
      --check --tokens=16 --max_seq=2048 --prefill=$prefill --prompt="$prompt" $options 2>&1 | tail -1)"
  done
done
PYTHONUNBUFFERED=1 python3 tools/decode_ab.py "main=$M/loom_bench" "red=$P/loom_bench" \
  "red11=$P/loom_bench --options=$P/eleven_pages.pbtxt" \
  "rh1=$M/loom_bench --options=$O/reduce_heads_1_splits_21.pbtxt" \
  "rh2=$M/loom_bench --options=$O/reduce_heads_2.pbtxt" \
  --rounds 2 --contexts 128,1024 --models "random:$S/tinyllama-1.1b.json,random:llama-3.2-1b" | tee "$OUT/ab.txt"
