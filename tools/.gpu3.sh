P=$(python3 -c "print(','.join(str(i*7%1000) for i in range(1,300)))")
for tool in memcheck racecheck synccheck; do timeout 200 compute-sanitizer --tool $tool build/tools/loom run --model=random:tiny --backend=gpu --prompt=$P --tokens=4 2>&1 | grep -E "SUMMARY|tokens:"; done
build/tools/loom export --model=random:llama-3.2-1b --out=/tmp/l1b > /dev/null
python3 tools/hf_compare.py --model /tmp/l1b --loom build/tools/loom --prompt-len 512 --tokens 32 --max-rel-error 1e-1 2>&1 | tail -9
