nvidia-smi -L
timeout 500 build/tests/gpu_test 2>&1 | grep -E "OK \]|FAILED|actual|Which" | head -40
timeout 120 build/tests/tile_gpu_test 2>&1 | tail -2
for n in 1 20 299; do P=$(python3 -c "print(','.join(str(i*7%1000) for i in range(1,$n+1)))"); timeout 120 build/tools/loom run --model=random:tiny --backend=gpu --prompt=$P --tokens=8 --check 2>&1 | tail -2; done
build/tools/loom export --model=random:llama-3.2-1b --out=/tmp/l1b > /dev/null
python3 tools/hf_compare.py --model /tmp/l1b --loom build/tools/loom --prompt-len 512 --tokens 32 --max-rel-error 1e-1 2>&1 | tail -9
