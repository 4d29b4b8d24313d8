S="4096x4096x4096;512x3072x2048;512x2048x2048;512x16384x2048;512x2048x8192;512x128256x2048;2048x3072x2048;2048x2048x2048;2048x16384x2048;2048x2048x8192;2048x128256x2048"
build/tools/gemm_bench --shapes="$S" 2>&1 | grep -v "^loading"
python3 tools/torch_gemm_baseline.py --shapes="$S" 2>&1 | tail -12
build/tools/prefill_bench --prompts=128,512,2048 --repeats=5 --e2e_prompt=1024 --e2e_tokens=128 2>&1 | grep -v "^loading\|packing\|uploading"
build/tools/loom export --model=random:llama-3.2-1b --out=/tmp/l1b > /dev/null
python3 tools/torch_prefill_baseline.py --model /tmp/l1b --prompts 128,512,2048 2>&1 | grep -v -i warn | tail -4
