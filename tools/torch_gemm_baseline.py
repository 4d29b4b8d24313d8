#!/usr/bin/env python3
"""cuBLAS (torch.matmul, bf16) on the shapes tools/gemm_bench measures Loom's GEMM opcode at: C = A · Wᵀ with
A [M, K] and W [N, K]. Median of --repeats CUDA-event timings after 3 warm-up calls, or --warmup_ms of the same
product (sustained: the power state settles; docs/history/performance_log.md has both), fresh random data per shape.

  python3 tools/torch_gemm_baseline.py --shapes "4096x4096x4096;512x3072x2048"
"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096x4096")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup_ms", type=float, default=0.0,
                    help="milliseconds of the product run before timing (0: 3 calls)")
    args = ap.parse_args()
    print(f"torch.matmul (cuBLAS) bf16, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for shape in filter(None, args.shapes.split(";")):
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        torch.matmul(a, w.t())
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, w.t())
        end.record()
        end.synchronize()
        for _ in range(int(args.warmup_ms / max(start.elapsed_time(end), 1e-3)) + 2):
            torch.matmul(a, w.t())
        times = []
        for _ in range(args.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, w.t())
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        ms = times[len(times) // 2]
        print(f"{m:6d} x {n:6d} x {k:6d}  {ms:9.3f} ms  (min {times[0]:.3f})  {2 * m * n * k / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
