#!/usr/bin/env python3
"""Loom against Hugging Face transformers on the same exported model.

  loom export --model=random:llama-3.2-1b --out=DIR
  python3 tools/hf_compare.py --model DIR --loom build/tools/loom --backend gpu

1. Loom decodes the prompt + --tokens greedy tokens and dumps every step's logits.
2. transformers (the folder's own *ForCausalLM class, float32 weights widened from the same bf16,
   eager attention) runs the same token sequence in one forward pass: per step,
   the relative error ||loom - hf|| / ||hf|| of the logits and whether both
   pick the same top-1 token.
3. transformers' own greedy generate() from the prompt, token by token against
   Loom's tokens.
Exit status 0 only if every step agrees on top-1 and the tokens are identical.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="exported Hugging Face folder")
    ap.add_argument("--loom", required=True, help="path to the loom binary")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--prompt", default="128000,9906,11,1917,0,358,1097")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="instead of --prompt: this many random token ids (seed 0), e.g. 512 for a prefill check")
    ap.add_argument("--prefill", default="true", choices=["true", "false"],
                    help="Loom consumes the prompt in one prefill pass (true) or token by token (false)")
    ap.add_argument("--max-rel-error", type=float, default=1e-3)
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    if args.prompt_len > 0:
        vocab = AutoConfig.from_pretrained(args.model).vocab_size
        prompt = torch.randint(0, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()

    with tempfile.TemporaryDirectory() as tmp:
        logits_path = os.path.join(tmp, "logits.bin")
        out = subprocess.run([args.loom, "run", f"--model={args.model}", f"--backend={args.backend}",
                              f"--tokens={args.tokens}", f"--prompt={','.join(map(str, prompt))}",
                              f"--logits_out={logits_path}", f"--prefill={args.prefill}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        line = [l for l in out.stdout.splitlines() if l.startswith("tokens:")][0]
        loom_new = [int(t) for t in line.split()[1:]]
        config = AutoConfig.from_pretrained(args.model)
        steps = len(prompt) - 1 + args.tokens
        loom_logits = np.fromfile(logits_path, dtype=np.float32).reshape(steps, config.vocab_size)

    sequence = prompt + loom_new
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").to(device).eval()
    with torch.no_grad():
        ids = torch.tensor([sequence[:steps]], device=device)
        hf_logits = model(ids).logits[0].float().cpu().numpy()  # [steps, vocab]
        hf_gen = model.generate(torch.tensor([prompt], device=device), max_new_tokens=args.tokens,
                                min_new_tokens=args.tokens, do_sample=False, num_beams=1)[0].tolist()[len(prompt):]

        # The yardstick for a bf16 engine: transformers itself in bf16 (sdpa) on the same sequence.
        bf16 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                    attn_implementation="sdpa").to(device).eval()
        hf16_logits = bf16(ids).logits[0].float().cpu().numpy()
        del bf16

    print(f"{'step':>4} {'position':>8} {'rel error':>10} {'loom top1':>10} {'hf top1':>8}  agree")
    worst, agree, worst_prompt, agree_prompt, gaps = 0.0, 0, 0.0, 0, []
    agree16, worst16 = 0, 0.0
    for step in range(steps):
        h16 = hf16_logits[step]
        agree16 += int(np.argmax(h16)) == int(np.argmax(hf_logits[step]))
        worst16 = max(worst16, float(np.linalg.norm(h16 - hf_logits[step]) / np.linalg.norm(hf_logits[step])))
        l, h = loom_logits[step], hf_logits[step]
        rel = float(np.linalg.norm(l - h) / np.linalg.norm(h))
        worst = max(worst, rel)
        if step < len(prompt):
            worst_prompt = max(worst_prompt, rel)
        same = int(np.argmax(l)) == int(np.argmax(h))
        agree += same
        agree_prompt += same and step < len(prompt)
        if not same:  # how close a call it was for transformers: the logit gap in units of the logits' std
            gaps.append(float((h[np.argmax(h)] - h[np.argmax(l)]) / np.std(h)))
        if steps <= 64 or not same or step % 64 == 0 or step == len(prompt) - 1:  # long prompts: a sample
            print(f"{step:>4} {step:>8} {rel:>10.2e} {int(np.argmax(l)):>10} {int(np.argmax(h)):>8}  "
                  f"{'yes' if same else 'NO'}")
    matching = sum(a == b for a, b in zip(loom_new, hf_gen))
    print(f"\ntop-1 agreement {agree}/{steps} steps ({agree_prompt}/{len(prompt)} prompt positions); worst logits "
          f"relative error {worst:.2e} (prompt positions {worst_prompt:.2e})")
    if gaps:
        print(f"disagreements are near-ties: transformers' own top-2 gap there is at most {max(gaps):.3f} std")
    print(f"yardstick, transformers bf16 (sdpa) against float32: top-1 agreement {agree16}/{steps}, worst relative "
          f"error {worst16:.2e}")
    print(f"greedy tokens: loom {loom_new}")
    print(f"               hf   {hf_gen}")
    print(f"identical greedy tokens: {matching}/{args.tokens}")
    ok = agree == steps and matching == args.tokens and worst <= args.max_rel_error
    print("AGREE" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
