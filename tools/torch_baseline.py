#!/usr/bin/env python3
"""The PyTorch baseline for loom_bench: Hugging Face Llama (same exported
weights, bf16), a static KV cache, and a one-token decode step compiled with
torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs), called in
a greedy loop — the pattern transformers documents for fast decoding.

For each context C: prefill C random tokens (not timed), then time --tokens
decode steps with CUDA events, --repeats times after warm-up (compilation);
the median per token is reported.

  python3 tools/torch_baseline.py --model DIR --contexts 128,1024 --tokens 128

--scheme puts PyTorch's own quantized paths on every decoder projection (the LM
head stays bf16, as in Loom's schemes), round-to-nearest from the bf16 weights:
  int4: gpt-fast's recipe, torch.ops.aten._weight_int4pack_mm (tinygemm) with a
        bf16 scale and zero per --group-size columns (asymmetric, 4 bits);
  fp8:  e4m3 weights with a scale per output row, torch._scaled_mm against x
        quantized to e4m3 per call (one scale; rows padded to 16, the
        kernel's minimum).
--config FILE builds the model from a config.json with random weights (speed
does not depend on the values: a 70B shape needs no checkpoint).
"""
import argparse
import statistics
import sys

import torch
from transformers import AutoConfig, LlamaForCausalLM, StaticCache


def make_cache(model, length):
    try:
        return StaticCache(config=model.config, max_cache_len=length)
    except TypeError:  # older transformers
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=length, device="cuda",
                           dtype=torch.bfloat16)


class Int4Linear(torch.nn.Module):
    """y = x W^T with W in 4 bits: tinygemm's packing, (q - 8) * scale + zero per group (gpt-fast's int4)."""

    def __init__(self, linear, group):
        super().__init__()
        w = linear.weight.detach().float()
        n, k = w.shape
        g = w.reshape(n, k // group, group)
        lo, hi = g.amin(dim=2, keepdim=True), g.amax(dim=2, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-6)
        q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8 * scale
        packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        self.weight = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
        self.scales_and_zeros = torch.cat([scale, zero], dim=2).permute(1, 0, 2).contiguous().to(torch.bfloat16)
        self.group, self.n = group, n

    def forward(self, x):
        y = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, x.shape[-1]), self.weight, self.group,
                                               self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.n)


class Fp8Linear(torch.nn.Module):
    """y = x W^T with W in e4m3 and a scale per row, on torch._scaled_mm (x quantized per call)."""

    def __init__(self, linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)
        self.weight_t = (w / scale).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        self.scale_b = scale.t().contiguous()  # [1, N]
        self.n = w.shape[0]

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        m = x2.shape[0]
        pad = (-m) % 16
        x2 = torch.nn.functional.pad(x2, (0, 0, 0, pad))
        amax = x2.abs().amax().float().clamp(min=1e-12)
        scale_a = (amax / 448).reshape(1, 1).expand(x2.shape[0], 1).contiguous()
        xq = (x2.float() / scale_a).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, self.weight_t, scale_a=scale_a, scale_b=self.scale_b, out_dtype=torch.bfloat16)
        return y[:m].reshape(*x.shape[:-1], self.n)


def quantize(model, scheme, group):
    """Every decoder projection replaced (the LM head stays bf16)."""
    count = 0
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, Int4Linear(child, group) if scheme == "int4" else Fp8Linear(child))
                    count += 1
        torch.cuda.empty_cache()
    return count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="a Hugging Face folder (bf16)")
    ap.add_argument("--config", default="", help="or a config.json: random weights")
    ap.add_argument("--scheme", default="bf16", choices=["bf16", "int4", "fp8"])
    ap.add_argument("--group-size", type=int, default=128, help="--scheme int4: columns per scale")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    if bool(args.model) == bool(args.config):
        ap.error("give --model or --config")
    if args.model:
        model = LlamaForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda().eval()
    else:
        config = AutoConfig.from_pretrained(args.config)
        torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU (an 8B in fp32 would take 32 GB)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).eval()
        torch.set_default_dtype(torch.float32)
    if args.scheme != "bf16":
        with torch.no_grad():
            n = quantize(model, args.scheme, args.group_size)
        print(f"{n} projections as {args.scheme}" + (f", group {args.group_size}" if args.scheme == "int4" else ""))
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
