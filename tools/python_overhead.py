#!/usr/bin/env python3
"""The Python package's overhead per generated token on the GPU (issue 11's figure).

Session.generate of --tokens tokens in one call (one prefill pass, then every decode step in one kernel launch),
wall clock, against the kernel time of the same work (CUDA events: the pass plus the decode launch). Everything
between them is host overhead, the Python layer's and the C++ host code's together; its share of the wall time
bounds the Python overhead from above. Also checks the tokens against `loom run` with the same prompt.

    python3 tools/python_overhead.py --model random:llama-3.2-1b --tokens 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import loom


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="random:llama-3.2-1b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", default="128000,9906,11,1917")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cli", default=os.environ.get("LOOM_CLI", "loom"), help="the loom command to compare with")
    a = ap.parse_args()
    prompt = [int(t) for t in a.prompt.split(",")]

    model = loom.load(a.model)
    schedule = loom.compile(model)
    session = loom.Session(schedule, backend="gpu")
    session.generate(prompt, a.tokens)  # warm-up: lowers the pass for this length, loads the kernel
    walls, kernels = [], []
    for _ in range(a.repeats):
        start = time.perf_counter()
        out = session.generate(prompt, a.tokens)
        walls.append((time.perf_counter() - start) * 1e3)
        kernels.append(out.prompt_ms + out.ms_per_token * (a.tokens - 1))
    wall, kernel = statistics.median(walls), statistics.median(kernels)
    print(f"{a.model}: {len(prompt)}-token prompt + {a.tokens} tokens in one generate call, median of {a.repeats}")
    print(f"  wall {wall:.3f} ms, kernels {kernel:.3f} ms, host overhead {wall - kernel:.3f} ms "
          f"= {(wall - kernel) / a.tokens * 1e3:.1f} us/token = {100 * (wall - kernel) / wall:.2f}% of the time")

    cli = subprocess.run([a.cli, "run", f"--model={a.model}", "--backend=gpu", f"--tokens={a.tokens}",
                          f"--prompt={a.prompt}"], capture_output=True, text=True, check=True)
    want = [int(t) for t in next(l for l in cli.stdout.splitlines() if l.startswith("tokens:")).split()[1:]]
    print(f"  tokens {'identical to' if out.new_ids == want else 'DIFFERENT from'} `loom run`")


if __name__ == "__main__":
    main()
