#!/usr/bin/env python3
"""A gated depthwise-conv language model (families/gated_conv.h) on Loom against an independent PyTorch version.

Loom builds the model's graph (per layer: RMSNorm, u and gate projections, a causal depthwise Conv1d with its state,
silu(gate) * conv, the out projection and residual, a SwiGLU MLP; then the LM head and argmax), prefills the prompt
in one pass and decodes token by token, each layer's conv state carried from the pass into decode. This script:

1. exports the model (`loom export`: config.json + model.safetensors, random weights) unless --model names a folder;
2. runs it in PyTorch from those files (float32 math on the same bf16 weights; F.conv1d over the padded sequence for
   the prompt, then a rolling K - 1 state per layer for each new token);
3. runs `loom run` with the one-pass prefill and compares the greedy tokens, and `loom run --prefill=false
   --logits_out` (every position's logits, token by token) against PyTorch's logits of the same sequence;
4. times Loom's prefill (prefill_bench beside the loom binary: warm, medians) and decode against PyTorch eager and
   torch.compile in the same call (GPU only).

    python3 examples/gated_conv_lm/gated_conv_lm.py --loom build/tools/loom [--preset gated-conv-small]
        [--prompt-len 256] [--tokens 64] [--backend gpu|cpu]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class TorchGatedConv:
    def __init__(self, folder, device):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        w = load_file(os.path.join(folder, "model.safetensors"), device=device)
        self.w = {k: v.float() for k, v in w.items()}
        self.k = self.cfg["conv_kernel"]
        self.eps = self.cfg["rms_norm_eps"]
        self.layers = self.cfg["num_hidden_layers"]
        self.head = self.w["embed"] if self.cfg.get("tie_word_embeddings") else self.w["lm_head"]

    def rms(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def mlp(self, x, p):
        n = self.rms(x, p + "norm2.weight")
        gated = F.silu(n @ self.w[p + "gate.weight"].T) * (n @ self.w[p + "up.weight"].T)
        return x + gated @ self.w[p + "down.weight"].T

    def gate_inputs(self, x, p):
        """Layer p's pre-norm and its u (the conv's input) and gate projections."""
        n = self.rms(x, p + "norm1.weight")
        return n @ self.w[p + "in_u.weight"].T, n @ self.w[p + "in_g.weight"].T

    def forward(self, tokens):
        """The whole sequence: logits [T, vocab] and each layer's state (its last K - 1 conv inputs)."""
        x = self.w["embed"][tokens]
        states = []
        for l in range(self.layers):
            p = f"layers.{l}."
            u, g = self.gate_inputs(x, p)
            padded = F.pad(u.T[None], (self.k - 1, 0))  # [1, D, K - 1 + T], zeros before the sequence
            c = F.conv1d(padded, self.w[p + "conv.weight"][:, None, :], self.w[p + "conv.bias"],
                         groups=u.shape[1])[0].T
            states.append(padded[0, :, padded.shape[2] - (self.k - 1):].clone())
            x = self.mlp(x + (F.silu(g) * c) @ self.w[p + "out.weight"].T, p)
        return self.rms(x, "final_norm") @ self.head.T, states

    def step(self, token, states):
        """One token: logits [1, vocab], each layer's state shifted along."""
        x = self.w["embed"][token]
        new_states = []
        for l in range(self.layers):
            p = f"layers.{l}."
            u, g = self.gate_inputs(x, p)
            window = torch.cat([states[l], u.T], dim=1)  # [D, K]
            c = (window * self.w[p + "conv.weight"]).sum(-1)[None] + self.w[p + "conv.bias"]
            new_states.append(window[:, 1:])
            x = self.mlp(x + (F.silu(g) * c) @ self.w[p + "out.weight"].T, p)
        return self.rms(x, "final_norm") @ self.head.T, new_states

    def generate(self, prompt, n):
        logits, states = self.forward(prompt)
        tokens = [int(logits[-1].argmax())]
        for _ in range(n - 1):
            logits, states = self.step(torch.tensor([tokens[-1]], device=prompt.device), states)
            tokens.append(int(logits[-1].argmax()))
        return tokens


def run_loom(loom, folder, prompt, tokens, backend, extra=()):
    cmd = [loom, "run", f"--model={folder}", f"--backend={backend}", "--prompt=" + ",".join(map(str, prompt)),
           f"--tokens={tokens}", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"loom failed: {' '.join(cmd[:3])} ...\n{out.stderr}{out.stdout}")
    text = out.stdout + out.stderr
    got = [int(t) for t in re.search(r"tokens: ([\d ]+)", text).group(1).split()]
    timing = re.search(r"backend: (.*)", text).group(1)
    return got, timing, text


def median_ms(fn, repeats, sync):
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--preset", default="gated-conv-small")
    ap.add_argument("--model", help="a folder written by `loom export` (default: export --preset to a temp folder)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", default="gpu" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    folder = args.model or tempfile.mkdtemp(prefix="gated_conv_")
    if not args.model:
        subprocess.run([args.loom, "export", f"--model=random:{args.preset}", f"--out={folder}"], check=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = TorchGatedConv(folder, device)
    vocab = model.cfg["vocab_size"]
    prompt = [(i * 7919 + 3) % vocab for i in range(args.prompt_len)]
    prompt_t = torch.tensor(prompt, device=device)

    # Greedy tokens: Loom's one-pass prefill + decode against PyTorch's.
    loom_tokens, loom_timing, _ = run_loom(args.loom, folder, prompt, args.tokens, args.backend)
    with torch.no_grad():
        torch_tokens = model.generate(prompt_t, args.tokens)
    same = next((i for i, (a, b) in enumerate(zip(loom_tokens, torch_tokens)) if a != b), len(loom_tokens))
    print(f"model {folder} ({model.cfg['num_hidden_layers']} layers, hidden {model.cfg['hidden_size']}, "
          f"kernel {model.k}, vocab {vocab}); prompt {len(prompt)} tokens, {args.tokens} generated")
    print(f"greedy tokens, Loom (prefill pass + decode) vs PyTorch: first {same} of {args.tokens} identical")

    # Every position's logits (token by token in Loom, teacher-forced on Loom's sequence) against PyTorch's.
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        run_loom(args.loom, folder, prompt, args.tokens, args.backend, ["--prefill=false", f"--logits_out={f.name}"])
        loom_logits = np.fromfile(f.name, dtype=np.float32).reshape(-1, vocab)
    seq = torch.tensor(prompt + loom_tokens[:-1], device=device)
    with torch.no_grad():
        ref = model.forward(seq)[0].cpu().numpy()
    err = np.linalg.norm(loom_logits - ref, axis=1) / np.linalg.norm(ref, axis=1)
    top1 = float((loom_logits.argmax(1) == ref.argmax(1)).mean())
    print(f"logits at all {len(err)} positions (token by token): worst relative error {err.max():.2e}, "
          f"top-1 agreement {top1 * 100:.1f}%")

    if device != "cuda" or args.backend != "gpu":
        return
    print(f"Loom `loom run` (one cold prefill, its pass just uploaded): {loom_timing}")
    bench = os.path.join(os.path.dirname(args.loom), "prefill_bench")
    if os.path.exists(bench):  # warm: the pass for this prompt length lowered and uploaded once, medians
        out = subprocess.run([bench, f"--model={folder}", f"--prompts={len(prompt)}", f"--repeats={args.repeats}"],
                             capture_output=True, text=True).stdout
        row = re.search(rf"^\s+{len(prompt)}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
        if row:
            print(f"Loom prefill_bench: time to first token {row.group(1)} ms (kernel {row.group(2)} ms; lowering the "
                  f"pass for a new prompt length adds {row.group(3)} ms), median of {args.repeats}")
    sync = torch.cuda.synchronize
    with torch.no_grad():
        _, states = model.forward(prompt_t)
        token = torch.tensor([1], device=device)
        rows = [("PyTorch eager", model.forward, model.step)]
        try:
            rows.append(("torch.compile", torch.compile(model.forward, dynamic=False),
                         torch.compile(model.step, mode="reduce-overhead", dynamic=False)))
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile unavailable: {e}")
        for name, fwd, step in rows:
            for _ in range(3):  # warm-up (compilation, CUDA graphs)
                fwd(prompt_t)
                step(token, states)
            prefill = median_ms(lambda: fwd(prompt_t), args.repeats, sync)
            decode = median_ms(lambda: step(token, states), args.repeats * 5, sync)
            print(f"{name}: prefill of {len(prompt)} tokens {prefill:.3f} ms, decode {decode:.3f} ms/token "
                  f"(median of {args.repeats} / {args.repeats * 5})")


if __name__ == "__main__":
    main()
