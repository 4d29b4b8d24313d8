timeout 200 build/tests/gpu_test --gtest_filter='GpuOpcodes.Gemm*:GpuOpcodes.Flash*:GpuOpcodes.Prefill*:GpuSchedules.PrefillMatchesTheVm' 2>&1 | grep -E "OK \]|FAILED|actual" | head
S="4096x4096x4096;2048x3072x2048;2048x16384x2048;2048x2048x8192"
build/tools/gemm_bench --shapes="$S" 2>&1 | grep " x "
python3 tools/torch_gemm_baseline.py --shapes="$S" 2>&1 | grep " x "
build/tools/prefill_bench --prompts=128,512,2048 --repeats=5 --e2e_prompt=1024 --e2e_tokens=128 2>&1 | grep -v "^loading\|packing\|uploading"
