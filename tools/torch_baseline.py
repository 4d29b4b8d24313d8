#!/usr/bin/env python3
"""The PyTorch baseline for loom_bench: Hugging Face Llama (same exported
weights, bf16), a static KV cache, and a one-token decode step compiled with
torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs), called in
a greedy loop — the pattern transformers documents for fast decoding.

For each context C: prefill C random tokens (not timed), then time --tokens
decode steps with CUDA events, --repeats times after warm-up (compilation);
the median per token is reported.

  python3 tools/torch_baseline.py --model DIR --contexts 128,1024 --tokens 128
"""
import argparse
import statistics
import sys

import torch
from transformers import LlamaForCausalLM, StaticCache


def make_cache(model, length):
    try:
        return StaticCache(config=model.config, max_cache_len=length)
    except TypeError:  # older transformers
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=length, device="cuda",
                           dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda().eval()
    contexts = [int(c) for c in args.contexts.split(",")]
    cache = make_cache(model, max(contexts) + args.tokens + 8)

    def decode_one(token, position):
        logits = model(token, cache_position=position, position_ids=position[None], past_key_values=cache,
                       use_cache=True, return_dict=False)[0]
        return torch.argmax(logits[:, -1], dim=-1)[:, None]

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'context':>8} {'tokens':>8} {'ms/token':>10}")
    with torch.no_grad():
        for ctx in contexts:
            ids = torch.randint(0, model.config.vocab_size, (1, ctx), device="cuda")
            times = []
            for r in range(args.repeats + 3):  # 3 warm-ups (the first compiles)
                cache.reset()
                logits = model(ids, cache_position=torch.arange(ctx, device="cuda"), past_key_values=cache,
                               use_cache=True, return_dict=False)[0]
                token = torch.argmax(logits[:, -1], dim=-1)[:, None]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for i in range(args.tokens):
                    torch.compiler.cudagraph_mark_step_begin()
                    token = step(token, torch.tensor([ctx + i], device="cuda")).clone()
                end.record()
                torch.cuda.synchronize()
                if r >= 3:
                    times.append(start.elapsed_time(end) / args.tokens)
            print(f"{ctx:>8} {args.tokens:>8} {statistics.median(times):>10.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
