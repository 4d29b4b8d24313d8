#!/usr/bin/env python3
"""Loom against Hugging Face transformers on random models that transformers itself creates.

For each entry (a family in a real checkpoint's shape): transformers builds the model from its own config class
(AutoModelForCausalLM.from_config), the weights are rescaled so that attention and logits are far from uniform
(transformers' init, std 0.02, makes every token almost equally likely and hides errors), save_pretrained writes a
bf16 safetensors folder, and then
  1. loom run --logits_out: the prompt + --tokens greedy tokens, every step's logits;
  2. loom run again with --speed-tokens tokens in one launch: ms/token, and the time it took to load the folder;
  3. transformers (float32 weights widened from the same bf16, eager attention), teacher-forced over the same
     sequence: per step the relative error ||loom - hf|| / ||hf|| and top-1 agreement; then transformers' own
     greedy generate() from the prompt against Loom's tokens.
One line per entry. Exit status 0 only if every entry agrees.

On the GPU machine (H100 80GB; an 8B entry needs ~35 GB of GPU memory for the float32 reference):
  python3 tools/hf_matrix.py --loom build/tools/loom                       # every entry
  python3 tools/hf_matrix.py --only smollm2-135m,qwen3-0.6b --layers 2     # a quick look
"""
import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

TF5 = int(transformers.__version__.split(".")[0]) >= 5
LLAMA3_1B = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}
LLAMA3_8B = dict(LLAMA3_1B, factor=8.0)


def entry(name, model_type, hidden, layers, heads, kv, inter, vocab, tied, theta, rope=None, **extra):
    return dict(name=name, model_type=model_type, rope=rope, theta=theta, kwargs=dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=8192,
        **extra))


# Real checkpoints' shapes (full layer counts and vocabularies), then small ones exercising one feature each.
ENTRIES = [
    entry("smollm2-135m", "llama", 576, 30, 9, 3, 1536, 49152, True, 100000.0),
    entry("smollm2-1.7b", "llama", 2048, 24, 32, 32, 8192, 49152, True, 130000.0),
    entry("tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 32000, False, 10000.0),
    entry("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, True, 500000.0, LLAMA3_1B, head_dim=64),
    entry("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, True, 500000.0, LLAMA3_1B, head_dim=128),
    entry("llama-3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, False, 500000.0, LLAMA3_8B),
    entry("mistral-7b", "mistral", 4096, 32, 32, 8, 14336, 32768, False, 1e6, sliding_window=None),
    entry("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, True, 1e6, rms_norm_eps=1e-6),
    entry("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, True, 1e6, rms_norm_eps=1e-6),
    entry("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, False, 1e6, rms_norm_eps=1e-6),
    entry("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, True, 1e6, head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 151936, True, 1e6, head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 151936, True, 1e6, head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, False, 1e6, head_dim=128, rms_norm_eps=1e-6),
    entry("llama-biases", "llama", 640, 4, 10, 2, 1792, 32000, False, 10000.0, attention_bias=True, mlp_bias=True),
    entry("llama-linear-rope", "llama", 512, 4, 8, 2, 1536, 32000, True, 10000.0,
          {"rope_type": "linear", "factor": 4.0}),
    entry("qwen2.5-yarn", "qwen2", 896, 4, 14, 2, 4864, 151936, True, 1e6,
          {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    entry("mistral-window", "mistral", 512, 4, 8, 2, 1536, 32768, False, 1e6, sliding_window=4096),
    entry("qwen3-bias-960", "qwen3", 960, 4, 15, 5, 2560, 151936, False, 1e6, head_dim=64, attention_bias=True),
]


def make_config(e, layers):
    kwargs = dict(e["kwargs"])
    if layers:
        kwargs["num_hidden_layers"] = layers
    if TF5:  # transformers 5: rope settings (theta included) live in rope_parameters
        kwargs["rope_parameters"] = dict(e["rope"] or {"rope_type": "default"}, rope_theta=e["theta"])
    else:
        kwargs["rope_theta"] = e["theta"]
        kwargs["rope_scaling"] = e["rope"]
    return AutoConfig.for_model(e["model_type"], **kwargs)


@torch.no_grad()
def rescale(model, config):
    """Weights that make attention and logits decisive: unit-gain projections (q and k stronger, so scores
    spread), norms around 1, visible biases, an LM head giving logits of std ~4."""
    gens = {}

    def fill(t, std, mean=0.0):  # drawn where the tensor lives: 8B draws on a CPU would take minutes
        if t.device not in gens:
            gens[t.device] = torch.Generator(device=t.device).manual_seed(1234)
        t.copy_(torch.randn(t.shape, generator=gens[t.device], device=t.device, dtype=torch.float32) * std + mean)

    for name, p in model.named_parameters():
        if "norm" in name:
            fill(p, 0.1, 1.0)
        elif name.endswith(".bias"):
            fill(p, 0.1)
        elif "embed_tokens" in name and not config.tie_word_embeddings:
            fill(p, 1.0)
        elif "embed_tokens" in name or "lm_head" in name:
            fill(p, 4.0 / config.hidden_size ** 0.5)
        elif "q_proj" in name or "k_proj" in name:
            fill(p, 1.5 / p.shape[1] ** 0.5)
        elif p.dim() == 2:
            fill(p, 1.0 / p.shape[1] ** 0.5)


def run_loom(args, folder, prompt, tokens, logits_path=None):
    cmd = [args.loom, "run", f"--model={folder}", f"--backend={args.backend}", f"--tokens={tokens}",
           "--prompt=" + ",".join(map(str, prompt))]
    if logits_path:
        cmd.append(f"--logits_out={logits_path}")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        lines = [l for l in out.stderr.splitlines() if l.startswith("loom:")] or out.stderr.splitlines()[-1:]
        return None, None, lines[-1] if lines else f"exit {out.returncode}"
    toks = [int(t) for t in next(l for l in out.stdout.splitlines() if l.startswith("tokens:")).split()[1:]]
    ms = float(re.search(r"([0-9.]+) ms/token", out.stdout).group(1))
    loaded = re.search(r"loaded in ([0-9.]+) s", out.stderr)
    return toks, (ms, float(loaded.group(1)) if loaded else float("nan")), None


def check(args, e):
    t0 = time.time()
    log = lambda what: print(f"  [{e['name']} {time.time() - t0:6.1f}s] {what}", file=sys.stderr, flush=True)
    config = make_config(e, args.layers)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = os.path.join(args.workdir, e["name"])
    shutil.rmtree(folder, ignore_errors=True)
    log("creating with transformers")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    rescale(model, config)
    params = sum(p.numel() for p in model.parameters()) / 1e9
    model.save_pretrained(folder)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(0, config.vocab_size, args.prompt_len)]
    row = dict(name=e["name"], family=e["model_type"], params=params, layers=config.num_hidden_layers)
    try:
        log("loom: logits of every step")
        logits_path = os.path.join(folder, "loom_logits.bin")
        loom_new, _, err = run_loom(args, folder, prompt, args.tokens, logits_path)  # the generated tokens
        if err:
            return dict(row, verdict=f"REFUSED: {err}")
        steps = len(prompt) - 1 + args.tokens
        loom_logits = np.fromfile(logits_path, dtype=np.float32).reshape(steps, config.vocab_size)
        log("loom: speed")
        _, timing, err = run_loom(args, folder, prompt, args.speed_tokens)
        if err:
            return dict(row, verdict=f"FAILED: {err}")
        ms, load_s = timing
        log("transformers: teacher forcing and generate")
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
        hf = hf.to(device).eval()
        with torch.no_grad():
            sequence = prompt + loom_new
            hf_logits = hf(torch.tensor([sequence[:steps]], device=device)).logits[0].float().cpu().numpy()
            gen = hf.generate(torch.tensor([prompt], device=device), max_new_tokens=args.tokens,
                              min_new_tokens=args.tokens, do_sample=False, num_beams=1)[0].tolist()[len(prompt):]
        del hf
        gc.collect()
        torch.cuda.empty_cache()
        rel = [float(np.linalg.norm(loom_logits[s] - hf_logits[s]) / np.linalg.norm(hf_logits[s])) for s in range(steps)]
        agree = sum(int(np.argmax(loom_logits[s]) == np.argmax(hf_logits[s])) for s in range(steps))
        same = sum(a == b for a, b in zip(loom_new, gen))
        probs = torch.softmax(torch.from_numpy(hf_logits), -1).max(-1).values.mean().item()
        ok = agree == steps and same == args.tokens and max(rel) <= args.max_rel_error
        return dict(row, agree=f"{agree}/{steps}", rel=max(rel), greedy=f"{same}/{args.tokens}", ms=ms, load=load_s,
                    std=float(hf_logits.std()), top1p=probs, verdict="AGREE" if ok else "DISAGREE")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        log("done")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--only", default="", help="comma-separated entry names")
    ap.add_argument("--layers", type=int, default=0, help="override every entry's layer count (0: real)")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens compared")
    ap.add_argument("--speed-tokens", type=int, default=128, help="tokens of the timed run (one launch)")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--workdir", default="/tmp/hf_matrix")
    ap.add_argument("--max-rel-error", type=float, default=1e-3)
    ap.add_argument("--markdown", default="", help="also write the table here")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    entries = ENTRIES
    if args.only:
        names = args.only.split(",")
        unknown = set(names) - {e["name"] for e in ENTRIES}
        if unknown:
            sys.exit(f"unknown entries: {', '.join(sorted(unknown))}")
        entries = [e for e in ENTRIES if e["name"] in names]
    if args.list:
        print("\n".join(e["name"] for e in entries))
        return 0
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}", flush=True)
    header = ("| model | family | params (B) | layers | top-1 agreement | worst rel. error | greedy identical "
              "| Loom ms/token | Loom load s | logits std | mean top-1 p | verdict |")
    print(header + "\n|" + "---|" * 12, flush=True)
    rows = []
    for e in entries:
        r = check(args, e)
        rows.append(r)
        line = (f"| {r['name']} | {r['family']} | {r['params']:.2f} | {r['layers']} | {r.get('agree', '-')} | "
                + (f"{r['rel']:.1e}" if "rel" in r else "-") + f" | {r.get('greedy', '-')} | "
                + (f"{r['ms']:.3f} | {r['load']:.1f}" if "ms" in r else "- | -") + " | "
                + (f"{r['std']:.1f} | {r['top1p']:.2f}" if "std" in r else "- | -") + f" | {r['verdict']} |")
        print(line, flush=True)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write(line + "\n")
    agreed = sum(r["verdict"] == "AGREE" for r in rows)
    print(f"\n{agreed}/{len(rows)} entries agree with transformers")
    return 0 if agreed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
