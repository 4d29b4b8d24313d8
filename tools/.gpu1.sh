set -x
nvidia-smi -L
timeout 300 build/tests/gpu_test --gtest_filter='GpuOpcodes.FlashAttentionPrefill:GpuOpcodes.SmallOpcodes*:GpuOpcodes.*Embed*' 2>&1 | tail -30
P20=$(python3 -c "print(','.join(str(i*7%1000) for i in range(1,21)))")
P299=$(python3 -c "print(','.join(str(i*7%1000) for i in range(1,300)))")
for p in 1 $P20 $P299; do timeout 120 build/tools/loom run --model=random:tiny --backend=gpu --prompt=$p --tokens=8 --check 2>&1 | tail -4; done
P512=$(python3 -c "print(','.join(str((i*7919)%128000) for i in range(1,513)))")
timeout 200 build/tools/loom run --model=random:llama-3.2-1b --backend=gpu --prompt=$P512 --tokens=32 2>&1 | tail -5
timeout 200 build/tools/loom run --model=random:llama-3.2-1b --backend=gpu --prompt=$P512 --tokens=32 --prefill=false 2>&1 | tail -3
