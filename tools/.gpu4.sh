build/tools/prefill_bench --prompts=128,512,2048 --repeats=5 2>&1 | grep -v "^loading\|packing\|uploading"
build/tools/loom export --model=random:llama-3.2-1b --out=/tmp/l1b > /dev/null
python3 tools/torch_prefill_baseline.py --model /tmp/l1b --prompts 128,512,2048 2>&1 | grep -v Warning | tail -5
python3 tools/hf_compare.py --model /tmp/l1b --loom build/tools/loom --prompt-len 512 --tokens 32 --max-rel-error 1e-1 2>&1 | tail -8
