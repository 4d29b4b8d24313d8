#!/usr/bin/env bash
# One device call for fixed_point_splitk.patch (docs/open_work.md, issue 42's TTFT cost). Binaries under .carry/fx:
#   base/  fe188ca's prefill_bench (float atomics: the cost's reference)
#   main/  main's prefill_bench and loom_bench (parts folded by PACK_ROWS)
#   fixed/ the patched build's gpu_test, determinism_test, shape_fuzz, prefill_bench, loom_bench
# (build the patched one in a worktree: git worktree add /work/fx main && cd /work/fx &&
#  git apply docs/experiments/fixed_point_splitk.patch && bash tools/build.sh; touch megakernel/megakernel.cu if a
#  build was running while you edited). Run: bash docs/experiments/fixed_point_call.sh (carry .carry/fx).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
cd .carry/fx || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 ./fixed/gpu_test > $OUT/gpu_test.log 2>&1; echo "gpu_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/gpu_test.log)"
grep -A4 Failure $OUT/gpu_test.log | head -20
timeout 90 ./fixed/determinism_test 2>&1 | grep -E "^\[  (PASSED|FAILED)|differ"
pb() { timeout 90 ./$1/prefill_bench --prompts=1,16,128,512,2048 --repeats=10 --e2e_prompt=0 ${2:-} 2>&1 |
       grep -E "^\s+[0-9]+ " | awk '{printf "%s:%s/%s ", $1, $3, $5} END {print ""}'; }
echo "prompt:kernel ms/instructions"
for round in 1 2; do
  echo "base:  $(pb base)"; echo "main:  $(pb main)"; echo "fixed: $(pb fixed)"; echo "fixed, parts: $(pb fixed --split_sum=parts)"
done
timeout 150 python3 ../../tools/decode_ab.py main=main/loom_bench fixed=fixed/loom_bench --models random:llama-3.2-1b \
  --contexts 128,1024 --rounds 2 2>&1 | tail -4
timeout 200 ./fixed/shape_fuzz --cases=150 --seconds=180 --report=$OUT/fuzz.txt 2>&1 | grep -vE "^refused|packing|uploading" | tail -5
