#!/usr/bin/env python3
"""ResNet-18 (torchvision, random weights) through Loom: exported to ONNX, compiled to one pass of tile
instructions, run on the GPU, and compared with PyTorch and onnxruntime on the same inputs; then timed against
PyTorch eager, torch.compile (CUDA graphs) and onnxruntime.

On a machine with a Hopper GPU, torch, torchvision and onnxruntime (from the repository root, after a build):
  python3 examples/resnet18/resnet18.py --loom build/tools/loom --batches 1,8 [--layers] [--trace] [--check] [--im2col] [--f32-gather]
Prints, per batch: Loom's relative error against PyTorch float32 and onnxruntime, top-1 agreement, and
milliseconds per forward pass of each (medians; Loom's is the kernel time of its one launch, CUDA events).
"""
import argparse
import json
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


IM2COL_OPTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench_options",
                              "conv_im2col.pbtxt")
F32_GATHER_OPTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench_options",
                                  "conv_f32_activations.pbtxt")


def loom_pass_ms(stdout):
    return float(re.search(r"pass in ([0-9.]+) ms", stdout).group(1))


def export(model, batch, path):
    kwargs = dict(input_names=["x"], output_names=["logits"], opset_version=17)
    try:
        torch.onnx.export(model, (torch.zeros(batch, 3, 224, 224),), path, dynamo=False, **kwargs)
    except TypeError:  # an older torch without the dynamo argument
        torch.onnx.export(model, (torch.zeros(batch, 3, 224, 224),), path, **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeat", type=int, default=30, help="timed runs of each (medians)")
    ap.add_argument("--check", action="store_true", help="also run loom's op-by-op float32 oracle (slow on the CPU)")
    ap.add_argument("--layers", action="store_true",
                    help="also time every distinct Conv2d of ResNet-18 alone: Loom's pass (CONV_GEMM, one launch) "
                         "against cuDNN (torch.nn.functional.conv2d, bf16, channels_last)")
    ap.add_argument("--im2col", action="store_true",
                    help="also time Loom with the convolutions as IM2COL + GEMM "
                         "(tools/bench_options/conv_im2col.pbtxt), the lowering before CONV_GEMM")
    ap.add_argument("--f32-gather", action="store_true",
                    help="also time Loom with every convolution gathering f32 (no bf16 copies of conv outputs: "
                         "tools/bench_options/conv_f32_activations.pbtxt)")
    ap.add_argument("--trace", action="store_true", help="print Loom's per-op trace summary of the whole network")
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
               f"--repeat={args.repeat}"] + (["--check"] if args.check else []) + \
              ([f"--trace={work}/trace_b{batch}.json"] if args.trace else [])
        print("$", " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        if run.returncode != 0:
            sys.exit(f"loom failed on batch {batch}")
        loom_ms = loom_pass_ms(run.stdout)
        y_loom = np.load(os.path.join(out, "logits.npy"))
        im2col_ms = None
        if args.im2col:
            run = subprocess.run([args.loom, "run", f"--model={path}", f"--input={work}/x.npy", "--backend=gpu",
                                  f"--repeat={args.repeat}", f"--options={IM2COL_OPTIONS}"],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"loom (IM2COL + GEMM) failed on batch {batch}: {run.stderr}")
            im2col_ms = loom_pass_ms(run.stdout)
            print(f"batch {batch}: Loom with IM2COL + GEMM {im2col_ms:.3f} ms, CONV_GEMM {loom_ms:.3f} ms")
        if args.f32_gather:
            for _ in range(2):  # alternating with the default build's options, twice
                runs = [subprocess.run([args.loom, "run", f"--model={path}", f"--input={work}/x.npy", "--backend=gpu",
                                        f"--repeat={args.repeat}"] + o, capture_output=True, text=True)
                        for o in ([f"--options={F32_GATHER_OPTIONS}"], [])]
                if any(r.returncode != 0 for r in runs):
                    sys.exit(f"loom (f32 gather) failed on batch {batch}: {runs[0].stderr}{runs[1].stderr}")
                print(f"batch {batch}: Loom with f32 gathers {loom_pass_ms(runs[0].stdout):.3f} ms, with bf16 conv "
                      f"activations (default) {loom_pass_ms(runs[1].stdout):.3f} ms", flush=True)

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
        rows.append((batch, loom_ms, im2col_ms, eager, eager_bf16, compiled_ms, ort_ms, sess.get_providers()[0]))
    im2col_head = " Loom IM2COL + GEMM |" if args.im2col else ""
    print(f"\n| batch | Loom (one launch) |{im2col_head} PyTorch eager f32 | PyTorch eager bf16 channels_last | "
          "torch.compile (reduce-overhead) f32 | onnxruntime |")
    print("|---|---|---|---|---|---|" + ("---|" if args.im2col else ""))
    for b, lm, im, e, eb, c, o, prov in rows:
        im_col = f" {im:.3f} ms |" if im is not None else ""
        print(f"| {b} | {lm:.3f} ms |{im_col} {e:.3f} ms | {eb:.3f} ms | {c:.3f} ms | {o:.3f} ms ({prov}) |")
    if args.layers:
        bench_layers(model.cpu(), args.loom, [int(b) for b in args.batches.split(",")], args.repeat, work,
                     args.im2col)


def conv_layers(model):
    """(name, conv, input height) of every distinct Conv2d shape of the network."""
    seen, layers = set(), []
    h = {"conv1": 224, "layer1": 56, "layer2": 56, "layer3": 28, "layer4": 14}
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Conv2d):
            continue
        stage = name.split(".")[0]
        inp = h[stage]
        if stage != "conv1" and not (name.endswith("0.conv1") or "downsample" in name):
            inp = inp // 2 if stage != "layer1" else inp  # after the block's stride
        key = (mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride, mod.padding, inp)
        if key not in seen:
            seen.add(key)
            layers.append((name, mod, inp))
    return layers


CONV_OPCODES = ("CONV_GEMM", "GEMM", "IM2COL")


def conv_span_us(trace_path, skip_first_op=False):
    """(span, tiles, us per tile) of the convolution in a traced pass: from the moment its first CONV_GEMM (or IM2COL)
    instruction's waits were met (its input ready) to its last instruction's end (the pass's layout copies of the
    NCHW input and output excluded; a split GEMM's zeroing runs before, beside the input's copy); its tensor-core
    instructions and their mean time from waits met to end. skip_first_op: the pass has a feeding convolution
    first (the one whose first instruction's waits were met first: the measured one waits for it), left out."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    conv = [e for e in events if e["name"] in CONV_OPCODES]
    if skip_first_op:
        first = min(conv, key=lambda e: e["ts"] + e["args"]["wait_us"])["args"]["op"]
        conv = [e for e in conv if e["args"]["op"] != first]
    start = min(e["ts"] + e["args"]["wait_us"] for e in conv)
    tiles = [e["dur"] - e["args"]["wait_us"] for e in conv if e["name"] in ("CONV_GEMM", "GEMM")]
    return max(e["ts"] + e["dur"] for e in conv) - start, len(tiles), sum(tiles) / len(tiles)


def loom_layer(loom, path, repeat, work, options=None, fed=False):
    """(pass ms: median kernel time of the whole one-launch pass, (conv span us, tiles, us per tile) in a traced
    run). fed: the model is a feeding convolution, then the one measured."""
    trace = os.path.join(work, "layer_trace.json")
    cmd = [loom, "run", f"--model={path}", "--backend=gpu", f"--repeat={repeat}", f"--trace={trace}"]
    run = subprocess.run(cmd + ([f"--options={options}"] if options else []), capture_output=True, text=True)
    if run.returncode != 0:
        return None
    return loom_pass_ms(run.stdout), conv_span_us(trace, skip_first_op=fed)


def graph_ms(fn, repeat, calls=20):
    """Milliseconds per call of fn, `calls` of them replayed from one CUDA graph (no launch overhead; median)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return median_ms(g.replay, iters=repeat) / calls


def bench_layers(model, loom, batches, repeat, work, im2col):
    """Every distinct Conv2d alone. Loom: the one-launch pass of that conv (NCHW in and out: with its layout copies)
    and the conv's own span inside it (trace), its input f32 (a graph input); and its span with a bf16 input, as
    inside the network where another convolution's epilogue writes it: the pass of a 1x1 convolution from 8 channels
    (one K slab: never split, so its output is stored as bf16) feeding it. cuDNN: one call timed alone (with its
    launch), and per call of 20 replayed from a CUDA graph (kernel time), on bf16 channels_last tensors."""
    im2col_head = " Loom IM2COL + GEMM conv |" if im2col else ""
    print(f"\n| layer | shape (C->OC, k, stride, H) | batch | Loom pass | Loom conv, f32 input (tiles x us each) |"
          f"{im2col_head} Loom conv, bf16 input (tiles x us each) | Loom TFLOP/s (f32, bf16 input) | "
          "cuDNN call | cuDNN in a graph | cuDNN TFLOP/s | cuDNN / Loom (f32, bf16 input) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if im2col else ""))
    for name, conv, h in conv_layers(model):
        for batch in batches:
            single = torch.nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                                     conv.padding, bias=True).eval()
            path = os.path.join(work, f"conv_{name}_b{batch}.onnx")
            export_shape(single, (batch, conv.in_channels, h, h), path)
            got = loom_layer(loom, path, repeat, work)
            if got is None:
                print(f"| {name} | loom failed |")
                continue
            loom_ms, (conv_us, tiles, tile_us) = got
            fed = torch.nn.Sequential(torch.nn.Conv2d(8, conv.in_channels, 1), single).eval()
            fed_path = os.path.join(work, f"fed_{name}_b{batch}.onnx")
            export_shape(fed, (batch, 8, h, h), fed_path)
            got = loom_layer(loom, fed_path, repeat, work, fed=True)
            fed_us, fed_tiles, fed_tile_us = got[1] if got is not None else (float("nan"), 0, float("nan"))
            im_col = ""
            if im2col:
                got = loom_layer(loom, path, repeat, work, IM2COL_OPTIONS)
                im_col = f" {got[1][0]:.1f} us ({got[1][1]} x {got[1][2]:.1f}) |" if got is not None else " failed |"
            oh = (h + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
            flops = 2 * batch * oh * oh * conv.out_channels * conv.in_channels * conv.kernel_size[0] ** 2
            x = torch.randn(batch, conv.in_channels, h, h, device="cuda", dtype=torch.bfloat16).to(
                memory_format=torch.channels_last)
            w = single.weight.detach().to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
            b = single.bias.detach().to("cuda", torch.bfloat16)
            with torch.no_grad():
                call = lambda: torch.nn.functional.conv2d(x, w, b, conv.stride, conv.padding)
                cudnn = median_ms(call, iters=repeat)
                cudnn_graph = graph_ms(call, repeat)
            print(f"| {name} | {conv.in_channels}->{conv.out_channels}, {conv.kernel_size[0]}x{conv.kernel_size[1]}, "
                  f"{conv.stride[0]}, {h} | {batch} | {loom_ms * 1e3:.1f} us | {conv_us:.1f} us ({tiles} x {tile_us:.1f}) |"
                  f"{im_col} {fed_us:.1f} us ({fed_tiles} x {fed_tile_us:.1f}) | "
                  f"{flops / conv_us / 1e6:.1f}, {flops / fed_us / 1e6:.1f} | {cudnn * 1e3:.1f} us | "
                  f"{cudnn_graph * 1e3:.1f} us | {flops / cudnn_graph / 1e9:.1f} | "
                  f"{cudnn_graph * 1e3 / conv_us:.2f}, {cudnn_graph * 1e3 / fed_us:.2f} |", flush=True)


def export_shape(model, shape, path):
    kwargs = dict(input_names=["x"], output_names=["y"], opset_version=17)
    try:
        torch.onnx.export(model, (torch.zeros(*shape),), path, dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(model, (torch.zeros(*shape),), path, **kwargs)


if __name__ == "__main__":
    main()
