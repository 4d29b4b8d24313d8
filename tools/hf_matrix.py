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
With --scheme FP8|W4A16|W8A16 the entry is quantized first: `loom quantize` writes a compressed-tensors folder,
Loom runs that folder, and transformers runs its weights as Loom reads them back (`loom export` of it: the
dequantized weights, in float32 for FP8 and int4, which Loom computes with as stored (int4: (u - z) * s unrounded),
in bf16 for the schemes it widens),
the reference the issue allows where transformers' own compressed-tensors integration is not installed; the reading itself is checked bit for bit against the library on
the CPU (graph/quantization_test.cc).
One line per entry (stdout; progress on stderr). Exit status 0 only if every entry agrees (--allow-refused: or is
refused by Loom with its own one-line error).

On the GPU machine (H100 80GB; an 8B entry needs ~35 GB of GPU memory for the float32 reference):
  python3 tools/hf_matrix.py --loom build/tools/loom                       # every entry
  python3 tools/hf_matrix.py --only smollm2-135m,qwen3-0.6b --layers 2     # a quick look
  python3 tools/hf_matrix.py --list                                         # the entries
Without a GPU (a smoke test of the script): --backend cpu --only tiny-llama.
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

TF_VERSION = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
TF5 = TF_VERSION >= (5, 0)
DTYPE = "dtype" if TF_VERSION >= (4, 56) else "torch_dtype"  # the argument's name before 4.56
LLAMA3_1B = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}
LLAMA3_8B = dict(LLAMA3_1B, factor=8.0)


def entry(name, model_type, hidden, layers, heads, kv, inter, vocab, tied, theta, rope=None, max_pos=8192, **extra):
    return dict(name=name, model_type=model_type, rope=rope, theta=theta, kwargs=dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=max_pos,
        **extra))


# Real checkpoints' shapes (full layer counts and vocabularies), then small ones exercising one feature each.
ENTRIES = [  # name, family, hidden, layers, heads, kv heads, intermediate, vocab, tied, rope theta, [rope scaling]
    entry("smollm2-135m", "llama", 576, 30, 9, 3, 1536, 49152, True, 100000.0, rms_norm_eps=1e-5),
    entry("smollm2-1.7b", "llama", 2048, 24, 32, 32, 8192, 49152, True, 130000.0, rms_norm_eps=1e-5),
    entry("tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 32000, False, 10000.0, max_pos=2048, rms_norm_eps=1e-5),
    entry("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, True, 500000.0, LLAMA3_1B, max_pos=131072,
          head_dim=64, rms_norm_eps=1e-5),
    entry("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, True, 500000.0, LLAMA3_1B, max_pos=131072,
          head_dim=128, rms_norm_eps=1e-5),
    entry("llama-3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, False, 500000.0, LLAMA3_8B, max_pos=131072,
          rms_norm_eps=1e-5),
    entry("mistral-7b", "mistral", 4096, 32, 32, 8, 14336, 32768, False, 1e6, max_pos=32768, sliding_window=None,
          rms_norm_eps=1e-5),
    entry("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, True, 1e6, max_pos=32768, rms_norm_eps=1e-6),
    entry("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, True, 1e6, max_pos=32768, rms_norm_eps=1e-6),
    entry("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, False, 1e6, max_pos=32768, rms_norm_eps=1e-6),
    entry("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, True, 1e6, max_pos=40960,
          head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 151936, True, 1e6, max_pos=40960,
          head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 151936, True, 1e6, max_pos=40960,
          head_dim=128, rms_norm_eps=1e-6),
    entry("qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, False, 1e6, max_pos=40960,
          head_dim=128, rms_norm_eps=1e-6),
    entry("llama-biases", "llama", 640, 4, 10, 2, 1792, 32000, False, 10000.0, attention_bias=True, mlp_bias=True),
    entry("llama-linear-rope", "llama", 512, 4, 8, 2, 1536, 32000, True, 10000.0,
          {"rope_type": "linear", "factor": 4.0}),
    entry("qwen2.5-yarn", "qwen2", 896, 4, 14, 2, 4864, 151936, True, 1e6,  # original 64: it bites early
          {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, max_pos=256),
    entry("mistral-window", "mistral", 512, 4, 8, 2, 1536, 32768, False, 1e6, sliding_window=4096),
    entry("qwen3-bias-960", "qwen3", 960, 4, 15, 5, 2560, 151936, False, 1e6, head_dim=64, attention_bias=True),
    entry("tiny-llama", "llama", 256, 2, 4, 2, 512, 1000, False, 10000.0),  # seconds even on a CPU
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
    """(new tokens, (ms/token, load s), None), or (None, None, verdict) when loom exits non-zero: REFUSED for its
    own one-line error (exit 1, "loom: ..."), FAILED for anything else (a crash, a signal)."""
    cmd = [args.loom, "run", f"--model={folder}", f"--backend={args.backend}", f"--tokens={tokens}",
           "--prompt=" + ",".join(map(str, prompt))]
    if logits_path:
        cmd.append(f"--logits_out={logits_path}")
    cmd.append(f"--prefill={args.prefill}")
    cmd.append(f"--kv_dtype={args.kv_dtype}")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        own = [l for l in out.stderr.splitlines() if l.startswith("loom:")]
        last = (own or out.stderr.strip().splitlines() or [""])[-1]
        kind = "REFUSED" if out.returncode == 1 and own else f"FAILED (exit {out.returncode})"
        return None, None, f"{kind}: {last}" if last else kind
    toks = [int(t) for t in next(l for l in out.stdout.splitlines() if l.startswith("tokens:")).split()[1:]]
    ms = float(re.search(r"([0-9.]+) ms/token", out.stdout).group(1))
    loaded = re.search(r"loaded in ([0-9.]+) s", out.stderr)
    return toks, (ms, float(loaded.group(1)) if loaded else float("nan")), None


def free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check(args, e, row, log):  # fills row, params first: a failure later still shows them
    config = make_config(e, args.layers)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = base = os.path.join(args.workdir, e["name"])
    shutil.rmtree(folder, ignore_errors=True)
    try:
        log("creating with transformers")
        torch.manual_seed(0)
        with torch.device(device):  # on the GPU: an 8B model initialises in seconds
            model = AutoModelForCausalLM.from_config(config, **{DTYPE: torch.bfloat16})
        rescale(model, config)
        row["params"] = params = sum(p.numel() for p in model.parameters()) / 1e9
        log(f"saving {params:.2f}B parameters")
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=args.shard_size)
        del model
        free()
        log(f"saved {sum(f.endswith('.safetensors') for f in os.listdir(folder))} safetensors file(s)")
        rng = np.random.default_rng(7)
        prompt = [int(t) for t in rng.integers(0, config.vocab_size, args.prompt_len)]
        reference = folder  # what transformers runs
        if args.scheme:
            log(f"loom quantize --scheme={args.scheme}, and its weights as read back for transformers")
            quantized, reference = folder + ".q", folder + ".dequantized"
            group = [f"--group_size={args.group_size}"] if args.scheme == "W4A16" else []
            for cmd in ([args.loom, "quantize", f"--model={folder}", f"--out={quantized}", f"--scheme={args.scheme}"]
                        + group,
                        [args.loom, "export", f"--model={quantized}", f"--out={reference}"]):
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    return dict(verdict=f"FAILED: {' '.join(cmd[1:3])}: {out.stderr.strip().splitlines()[-1:]}")
            folder = quantized
        log("loom: logits of every step")
        logits_path = os.path.join(folder, "loom_logits.bin")
        loom_new, _, err = run_loom(args, folder, prompt, args.tokens, logits_path)  # the generated tokens
        if err:
            return dict(verdict=err)
        steps = len(prompt) - 1 + args.tokens
        loom_logits = np.fromfile(logits_path, dtype=np.float32).reshape(steps, config.vocab_size)
        log(f"loom: speed ({args.speed_tokens} tokens)")
        _, timing, err = run_loom(args, folder, prompt, args.speed_tokens)
        if err:
            return dict(verdict=err.replace("REFUSED", "FAILED", 1))  # the first run went through
        ms, load_s = timing
        log("transformers: float32 teacher forcing")
        hf = AutoModelForCausalLM.from_pretrained(reference, attn_implementation="eager", **{DTYPE: torch.float32})
        hf = hf.to(device).eval()
        hf.generation_config.eos_token_id = None  # Loom never stops early: neither may generate()
        with torch.no_grad():
            sequence = prompt + loom_new
            hf_logits = hf(torch.tensor([sequence[:steps]], device=device)).logits[0].float().cpu().numpy()
            log("transformers: greedy generate")
            gen = hf.generate(torch.tensor([prompt], device=device), max_new_tokens=args.tokens,
                              min_new_tokens=args.tokens, do_sample=False, num_beams=1)[0].tolist()[len(prompt):]
        del hf
        rel = [float(np.linalg.norm(loom_logits[s] - hf_logits[s]) / np.linalg.norm(hf_logits[s]))
               for s in range(steps)]
        agree = sum(int(np.argmax(loom_logits[s]) == np.argmax(hf_logits[s])) for s in range(steps))
        same = sum(a == b for a, b in zip(loom_new, gen))
        probs = torch.softmax(torch.from_numpy(hf_logits), -1).max(-1).values.mean().item()
        ok = agree == steps and same == args.tokens and max(rel) <= args.max_rel_error
        return dict(agree=f"{agree}/{steps}", rel=max(rel), greedy=f"{same}/{args.tokens}", ms=ms, load=load_s,
                    std=float(hf_logits.std()), top1p=probs, verdict="AGREE" if ok else "DISAGREE")
    finally:
        for f in (base, base + ".q", base + ".dequantized"):
            shutil.rmtree(f, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--only", default="", help="comma-separated entry names")
    ap.add_argument("--layers", type=int, default=0, help="override every entry's layer count (0: real)")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens compared")
    ap.add_argument("--speed-tokens", type=int, default=128, help="tokens of the timed run (one launch)")
    ap.add_argument("--backend", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--workdir", default="/tmp/hf_matrix")
    ap.add_argument("--max-rel-error", type=float, default=1e-3)
    ap.add_argument("--prefill", default="false", choices=["true", "false"],
                    help="Loom consumes the prompt in one prefill pass (bf16 tensor-core GEMMs: pass a looser "
                         "--max-rel-error) or token by token (float32, the default here)")
    ap.add_argument("--shard-size", default="2GB", help="save_pretrained's max_shard_size (transformers 5's default "
                    "of 50GB would never shard; 2GB shards every model from ~1B up)")
    ap.add_argument("--markdown", default="", help="also write the table here")
    ap.add_argument("--allow-refused", action="store_true", help="entries Loom refuses do not fail the run")
    ap.add_argument("--scheme", default="", choices=["", "FP8", "W4A16", "W8A16"],
                    help="quantize each entry with loom quantize first (see above)")
    ap.add_argument("--group-size", type=int, default=128, help="--scheme W4A16's columns per scale")
    ap.add_argument("--kv-dtype", default="f32", choices=["f32", "bf16"],
                    help="Loom's KV cache (loom run --kv_dtype); transformers' reference keeps float32")
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
        for e in entries:
            k = e["kwargs"]
            print(f"{e['name']:18} {e['model_type']:8} hidden {k['hidden_size']}, {k['num_hidden_layers']} layers, "
                  f"{k['num_attention_heads']}/{k['num_key_value_heads']} heads, vocab {k['vocab_size']}")
        return 0
    if not os.access(args.loom, os.X_OK):
        sys.exit(f"no loom binary at {args.loom}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, loom --backend={args.backend}"
          + (f", weights {args.scheme}" if args.scheme else "") + (f", KV cache {args.kv_dtype}"),
          flush=True)
    header = ("| model | family | params (B) | layers | top-1 agreement | worst rel. error | greedy identical "
              "| Loom ms/token | Loom load s | logits std | mean top-1 p | verdict |\n|" + "---|" * 12)
    print(header, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n")
    rows = []
    for i, e in enumerate(entries):
        t0 = time.time()
        log = lambda what: print(f"[{i + 1}/{len(entries)} {e['name']} {time.time() - t0:6.1f}s] {what}",
                                 file=sys.stderr, flush=True)
        r = dict(name=e["name"], family=e["model_type"], layers=args.layers or e["kwargs"]["num_hidden_layers"])
        try:
            r.update(check(args, e, r, log))
        except Exception as ex:  # a failure of this entry, not of the run: the next entry goes on
            r["verdict"] = f"FAILED: {type(ex).__name__}: {str(ex).strip().splitlines()[0] if str(ex).strip() else ''}"
        free()
        log(f"done: {r['verdict']}")
        rows.append(r)
        line = (f"| {r['name']} | {r['family']} | " + (f"{r['params']:.2f}" if "params" in r else "-")
                + f" | {r['layers']} | {r.get('agree', '-')} | " + (f"{r['rel']:.1e}" if "rel" in r else "-")
                + f" | {r.get('greedy', '-')} | " + (f"{r['ms']:.3f} | {r['load']:.1f}" if "ms" in r else "- | -")
                + " | " + (f"{r['std']:.1f} | {r['top1p']:.2f}" if "std" in r else "- | -") + f" | {r['verdict']} |")
        print(line, flush=True)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write(line + "\n")
    ok = [r for r in rows if r["verdict"] == "AGREE" or (args.allow_refused and r["verdict"].startswith("REFUSED"))]
    refused = sum(r["verdict"].startswith("REFUSED") for r in rows)
    summary = (f"{sum(r['verdict'] == 'AGREE' for r in rows)}/{len(rows)} entries agree with transformers"
               + (f", {refused} refused by Loom" if refused else "")
               + "".join(f"\n  {r['name']}: {r['verdict']}" for r in rows if r["verdict"] != "AGREE"))
    print("\n" + summary, flush=True)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + summary.replace("\n  ", "\n- ") + "\n")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
