#!/usr/bin/env python3
"""The PyTorch baseline for loom_bench: Hugging Face Llama (same exported
weights, bf16), static KV cache, torch.compile(mode="reduce-overhead"), greedy
decode of --tokens tokens at each context length. Decode time per token is
(time of generate(ctx, tokens + 1) - time of generate(ctx, 1)) / tokens, each
the median of --repeats runs after warm-up (compilation), CUDA-synchronised.

  python3 tools/torch_baseline.py --model DIR --contexts 128,1024 --tokens 128
"""
import argparse
import statistics
import sys
import time

import torch
from transformers import LlamaForCausalLM


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                   cache_implementation="static")
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda().eval()
    model.generation_config.pad_token_id = model.generation_config.eos_token_id
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'context':>8} {'tokens':>8} {'ms/token':>10}")
    with torch.no_grad():
        for ctx in [int(c) for c in args.contexts.split(",")]:
            ids = torch.randint(0, model.config.vocab_size, (1, ctx), device="cuda")
            for _ in range(3):  # compile and warm up both shapes
                timed_generate(model, ids, args.tokens + 1)
                timed_generate(model, ids, 1)
            long = [timed_generate(model, ids, args.tokens + 1) for _ in range(args.repeats)]
            short = [timed_generate(model, ids, 1) for _ in range(args.repeats)]
            ms = (statistics.median(long) - statistics.median(short)) / args.tokens * 1e3
            print(f"{ctx:>8} {args.tokens:>8} {ms:>10.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
