#!/usr/bin/env python3
"""ResNet-18 (torchvision, random weights) through Loom: exported to ONNX, compiled to one pass of tile
instructions, run on the GPU, and compared with PyTorch and onnxruntime on the same inputs; then timed against
PyTorch eager, torch.compile (CUDA graphs) and onnxruntime.

On a machine with a Hopper GPU, torch, torchvision and onnxruntime (from the repository root, after a build):
  python3 examples/resnet18/resnet18.py --loom build/tools/loom --batches 1,8
Prints, per batch: Loom's relative error against PyTorch float32 and onnxruntime, top-1 agreement, and
milliseconds per forward pass of each (medians; Loom's is the kernel time of its one launch, CUDA events).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torchvision


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def median_ms(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def export(model, batch, path):
    x = torch.zeros(batch, 3, 224, 224)
    kwargs = dict(input_names=["x"], output_names=["logits"], opset_version=17)
    try:
        torch.onnx.export(model, (x,), path, dynamo=False, **kwargs)
    except TypeError:  # an older torch without the dynamo argument
        torch.onnx.export(model, (x,), path, **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeat", type=int, default=30, help="timed runs of each (medians)")
    ap.add_argument("--check", action="store_true", help="also run loom's op-by-op float32 oracle (slow on the CPU)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    work = tempfile.mkdtemp(prefix="loom_resnet18_")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.cuda.get_device_name()}")
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        path = os.path.join(work, f"resnet18_b{batch}.onnx")
        export(model, batch, path)
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
        np.save(os.path.join(work, "x.npy"), x.numpy())
        out = os.path.join(work, f"out_b{batch}")
        os.makedirs(out, exist_ok=True)
        cmd = [args.loom, "run", f"--model={path}", f"--input={work}/x.npy", "--backend=gpu", f"--out={out}",
               f"--repeat={args.repeat}"] + (["--check"] if args.check else [])
        print("$", " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        if run.returncode != 0:
            sys.exit(f"loom failed on batch {batch}")
        loom_ms = float(re.search(r"pass in ([0-9.]+) ms", run.stdout).group(1))
        y_loom = np.load(os.path.join(out, "logits.npy"))

        with torch.no_grad():
            y_torch = model(x).numpy()
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=ort.get_available_providers())
        y_ort = sess.run(None, {"x": x.numpy()})[0]
        print(f"batch {batch}: Loom vs PyTorch f32 relative error {rel(y_loom, y_torch):.2e}, vs onnxruntime "
              f"{rel(y_loom, y_ort):.2e}; top-1 agreement {np.mean(y_loom.argmax(1) == y_torch.argmax(1)):.2f}; "
              f"onnxruntime vs PyTorch {rel(y_ort, y_torch):.2e} (providers {sess.get_providers()})")

        gpu = model.cuda()
        xg = x.cuda()
        with torch.no_grad():
            eager = median_ms(lambda: gpu(xg), iters=args.repeat)
            gpu_cl = gpu.to(memory_format=torch.channels_last)
            xg_cl = xg.to(memory_format=torch.channels_last)

            def bf16():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return gpu_cl(xg_cl)
            eager_bf16 = median_ms(bf16, iters=args.repeat)
            compiled = torch.compile(gpu, mode="reduce-overhead")
            compiled_ms = median_ms(lambda: compiled(xg), warmup=10, iters=args.repeat)
        model.cpu()
        import time
        t = []
        for i in range(max(3, args.repeat // 5)):
            s = time.perf_counter()
            sess.run(None, {"x": x.numpy()})
            t.append((time.perf_counter() - s) * 1e3)
        ort_ms = float(np.median(t))
        rows.append((batch, loom_ms, eager, eager_bf16, compiled_ms, ort_ms, sess.get_providers()[0]))
    print("\n| batch | Loom (one launch) | PyTorch eager f32 | PyTorch eager bf16 channels_last | torch.compile "
          "(reduce-overhead) f32 | onnxruntime |")
    print("|---|---|---|---|---|---|")
    for b, lm, e, eb, c, o, prov in rows:
        print(f"| {b} | {lm:.3f} ms | {e:.3f} ms | {eb:.3f} ms | {c:.3f} ms | {o:.3f} ms ({prov}) |")


if __name__ == "__main__":
    main()
