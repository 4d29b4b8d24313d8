#!/usr/bin/env python3
"""The PyTorch baselines for tools/prefill_bench: time to first token of a Hugging Face Llama (the same exported
weights, bf16) from a prompt of P token ids already on the GPU to the first new token on the host:
  eager:    model(ids, logits_to_keep=1) with sdpa attention, then argmax (what generate() does for its prefill)
  compiled: the same forward under torch.compile (default mode, one compile per prompt length, warmed up first)
CUDA-synchronised wall clock, median of --repeats after warm-up, fresh random prompts.

  python3 tools/torch_prefill_baseline.py --model DIR --prompts 128,512,2048
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", default="128,512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    vocab = model.config.vocab_size

    def first_token(forward, ids):
        logits = forward(input_ids=ids, logits_to_keep=1, use_cache=True).logits
        return int(torch.argmax(logits[0, -1]))  # .item(): the token reaches the host

    compiled = torch.compile(model.forward)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'prompt':>8} {'eager ms':>10} {'compiled ms':>12}")
    with torch.no_grad():
        for p in (int(x) for x in args.prompts.split(",")):
            row = []
            for forward, warmups in ((model.forward, 2), (compiled, 3)):
                times = []
                for r in range(args.repeats + warmups):
                    ids = torch.randint(0, vocab, (1, p), device="cuda")
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    first_token(forward, ids)
                    elapsed = (time.perf_counter() - start) * 1e3
                    if r >= warmups:
                        times.append(elapsed)
                row.append(statistics.median(times))
            print(f"{p:>8} {row[0]:>10.3f} {row[1]:>12.3f}")


if __name__ == "__main__":
    main()
