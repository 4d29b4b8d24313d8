#!/usr/bin/env python3
"""Convolutions of unusual shapes through Loom on the GPU (CONV_GEMM, grouped, 1-D, rectangular, dilated, strided
past the kernel, batch 17, 1024 channels, channels padded to 8, a split sum copied to bf16, a max pool, tall tiles), each exported from torch.nn to ONNX and compared with PyTorch float32 and
with Loom's own op-by-op oracle (`loom run --check`). On a machine with a Hopper GPU and torch, after a build:

  python3 tools/conv_sweep.py build/tools/loom

Prints one line per case (relative error against PyTorch, the oracle's verdict, the pass's size) and exits non-zero
if any case fails (relative error 1e-2: the GEMM operands are bf16).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

loom = sys.argv[1] if len(sys.argv) > 1 else "build/tools/loom"
work = tempfile.mkdtemp(prefix="loom_conv_sweep_")
class FedResidual(torch.nn.Module):
    """A 1x1 convolution from 8 channels (stored bf16 for the next) and a 3x3 one adding it back, ReLU'd."""

    def __init__(self, c):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(8, c, 1), torch.nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return torch.relu(self.b(y) + y)


cases = [  # name, module, input shape
    ("stem 11x11 s4", torch.nn.Conv2d(3, 16, 11, 4, 2), (2, 3, 67, 67)),
    ("5x5 dilation 3", torch.nn.Conv2d(8, 12, 5, 1, 6, dilation=3), (1, 8, 20, 17)),
    ("groups 3 of 3 ch", torch.nn.Conv2d(9, 12, 3, 2, 1, groups=3), (2, 9, 15, 13)),
    ("1x1 1024->1000", torch.nn.Conv2d(1024, 1000, 1), (3, 1024, 3, 3)),
    ("conv1d groups 2", torch.nn.Conv1d(16, 32, 7, 3, groups=2), (2, 16, 100)),
    ("4 ch no bias", torch.nn.Conv2d(4, 20, 3, 1, 1, bias=False), (1, 4, 9, 9)),
    ("1x7", torch.nn.Conv2d(32, 48, (1, 7), 1, (0, 3)), (2, 32, 17, 17)),
    ("7x1", torch.nn.Conv2d(48, 32, (7, 1), 1, (3, 0)), (2, 48, 17, 17)),
    ("2x2 stride 3", torch.nn.Conv2d(24, 40, 2, 3), (1, 24, 14, 11)),
    ("1x1 on 1x1", torch.nn.Conv2d(1, 3, 1), (1, 1, 1, 1)),
    ("groups 4 of 32", torch.nn.Conv2d(128, 64, 3, 1, 1, groups=4), (2, 128, 12, 12)),
    ("batch 17 3x3", torch.nn.Conv2d(16, 16, 3, 1, 1), (17, 16, 9, 9)),
    # conv1 split over K, its sum copied to bf16 with the ReLU (NHWC_BF16) for conv2's 7 K slabs an instruction
    ("split sum to bf16", torch.nn.Sequential(torch.nn.Conv2d(32, 256, 3, 1, 1), torch.nn.ReLU(),
                                              torch.nn.Conv2d(256, 64, 3, 1, 1)), (16, 32, 14, 14)),
    ("3 ch 7x7 s2 + pool", torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.ReLU(),
                                               torch.nn.MaxPool2d(3, 2, 1)), (2, 3, 45, 45)),
    # more than a wave of 128-row tiles, <= 64 channels, a bf16 input: tall 256 x 64 tiles (the last one partial)
    ("tall 64 ch fed", torch.nn.Sequential(torch.nn.Conv2d(8, 64, 1), torch.nn.Conv2d(64, 64, 3, 1, 1)),
     (6, 8, 55, 55)),
    ("tall 48 ch + relu", torch.nn.Sequential(torch.nn.Conv2d(8, 32, 1), torch.nn.Conv2d(32, 48, 3, 1, 1),
                                             torch.nn.ReLU()), (6, 8, 55, 55)),
    ("tall residual", FedResidual(64), (6, 8, 55, 55)),
]
bad = 0
for name, m, shape in cases:
    m = m.eval()
    path = os.path.join(work, "m.onnx")
    torch.onnx.export(m, (torch.zeros(*shape),), path, input_names=["x"], output_names=["y"], opset_version=17,
                      dynamo=False)
    x = torch.randn(*shape)
    np.save(os.path.join(work, "x.npy"), x.numpy())
    out = os.path.join(work, "out")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([loom, "run", f"--model={path}", f"--input={work}/x.npy", "--backend=gpu", f"--out={out}",
                        "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name:20s} loom failed: {r.stderr.strip().splitlines()[-1]}")
        bad += 1
        continue
    y = np.load(os.path.join(out, "y.npy"))
    with torch.no_grad():
        ref = m(x).numpy()
    err = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
    oracle = "oracle ok" if "every output agrees" in r.stdout else "ORACLE DISAGREES"
    ok = err < 1e-2 and oracle == "oracle ok"
    bad += not ok
    ops = [l for l in r.stderr.splitlines() if "graph pass" in l]
    print(f"{name:20s} {str(shape):22s} rel err vs torch {err:.2e}  {oracle}  {ops[0] if ops else ''}")
print("all agree" if bad == 0 else f"{bad} case(s) failed")
sys.exit(1 if bad else 0)
