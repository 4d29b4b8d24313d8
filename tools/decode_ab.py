#!/usr/bin/env python3
"""Decode speed of several builds side by side, alternating (the A/B method of docs/performance.md).

    python3 tools/decode_ab.py main=old/loom_bench new=build/tools/loom_bench \\
        'fused=build/tools/loom_bench --options=tools/bench_options/fused_attention_reduce.pbtxt' \\
        'on=SOME_SWITCH=1 build/tools/loom_bench' \\
        [--models random:llama-3.2-1b,random:tests/data/hf_configs/transformers5/tinyllama-1.1b.json] \\
        [--contexts 128,1024] [--tokens 64] [--repeats 3] [--rounds 2]

Each build is NAME=COMMAND: a loom_bench binary with any flags of its own, after optional ENV=VALUE words. Every
round runs each build once over every model and context (the order reversed every other round, so no build always
goes first); the table gives each run's ms/token, then each build's median over the rounds and its difference from
the first build. Timings compare only within one run of this script: one machine, one call.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys

ROW = re.compile(r"^\s*(\d+)\s+\d+\s+([0-9.]+)\s")
MODEL = re.compile(r"^model (\S+):")
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def parse_build(spec):
    """NAME=[ENV=VALUE ...] COMMAND [FLAGS] -> (name, env, argv)."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    if not sep or not name or not words:
        sys.exit(f"decode_ab: build '{spec}': expected NAME=COMMAND")
    env = {}
    while words and ENV.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words:
        sys.exit(f"decode_ab: build '{spec}': no command after its environment")
    return name, env, words


def run(build, args):
    """One run of a build: {(model, context): ms/token}."""
    name, env, argv = build
    cmd = argv + [f"--models={args.models}", f"--contexts={args.contexts}", f"--tokens={args.tokens}",
                  f"--repeats={args.repeats}"]
    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"decode_ab: build {name} failed ({shlex.join(cmd)}): {e.strerror}")
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        sys.exit(f"decode_ab: build {name} failed ({shlex.join(cmd)}):\n{tail}")
    out, model = {}, None
    for line in proc.stdout.splitlines():
        if m := MODEL.match(line):
            model = m.group(1)
        elif model is not None and (m := ROW.match(line)):
            out[(model, int(m.group(1)))] = float(m.group(2))
    return out


def short(model):
    return model.split("/")[-1].removeprefix("random:").removesuffix(".json")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="NAME=[ENV=VALUE ...] COMMAND [FLAGS]")
    ap.add_argument("--models", default="random:llama-3.2-1b,random:tests/data/hf_configs/transformers5/"
                    "tinyllama-1.1b.json")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.rounds < 1 or args.tokens < 1 or args.repeats < 1:
        sys.exit("decode_ab: --rounds, --tokens and --repeats must be at least 1")
    builds = [parse_build(b) for b in args.builds]
    names = [b[0] for b in builds]
    if len(set(names)) != len(names):
        sys.exit(f"decode_ab: build names must differ: {', '.join(names)}")
    models = [m for m in args.models.split(",") if m]
    contexts = [int(c) for c in args.contexts.split(",") if c]
    keys = [(m, c) for m in models for c in contexts]
    header = "".join(f"  {short(m)[:18] + ' ' + str(c):>24}" for m, c in keys)

    runs = {name: [] for name in names}
    print(f"{'build':<12} {'round':>5}{header}", flush=True)
    for r in range(args.rounds):
        for build in (builds if r % 2 == 0 else builds[::-1]):
            result = run(build, args)
            missing = [k for k in keys if k not in result]
            if missing:
                sys.exit(f"decode_ab: build {build[0]} printed no row for {missing[0][0]} at {missing[0][1]}")
            runs[build[0]].append(result)
            print(f"{build[0]:<12} {r + 1:>5}" + "".join(f"  {result[k]:>24.4f}" for k in keys), flush=True)

    base = names[0]
    print(f"\nmedian over {args.rounds} round(s), ms/token (difference from {base}):")
    print(f"{'build':<12} {'':>5}{header}")
    for name in names:
        cells = []
        for k in keys:
            med = statistics.median(run[k] for run in runs[name])
            ref = statistics.median(run[k] for run in runs[base])
            cells.append(f"{med:.4f}" if name == base else f"{med:.4f} ({(med / ref - 1) * 100:+.1f}%)")
        print(f"{name:<12} {'':>5}" + "".join(f"  {c:>24}" for c in cells))


if __name__ == "__main__":
    main()
