#!/usr/bin/env python3
"""Models as today's PyTorch exports them, through Loom: issue 46's table.

Each model (torchvision classifiers, a torch.nn.TransformerEncoder stack, BERT (ids alone, and with a padding
attention mask), DistilBERT and GPT-2 (its forward without a cache) from transformers' own classes; random weights) is exported with torch.onnx.export's default exporter (or --exporter=torchscript),
run by onnxruntime (the reference) and by `loom run` on the GPU (or the CPU VM), and compared: relative RMS error
of every output against onnxruntime and top-1 agreement of classifier logits. Loom's refusals are printed whole
(they name every op type it does not lower). With --time, Loom's kernel time, PyTorch eager and torch.compile
(reduce-overhead) per pass at each batch, medians of CUDA-event timings, side by side in the one run.

On the device (torch, torchvision, transformers, onnxruntime), from the repository root after a build:
  python3 tools/onnx_zoo.py --loom build/tools/loom [--models resnet18,bert] [--batches 1] [--time] [--keep DIR]
Prints one markdown row per model and batch: model | batch | opset | ONNX ops | result | error | Loom ms | eager ms |
compile ms. Exit status 0 whatever the models do (the table is the result); 2 on a usage error.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

TORCHVISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
               "squeezenet1_0", "shufflenet_v2_x1_0", "regnet_y_400mf", "convnext_tiny", "densenet121", "vit_b_16"]
OTHERS = ["transformer_encoder", "bert", "bert_mask", "distilbert", "gpt2"]


def rel_rms(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30))


def build(name, batch):
    """(module, example inputs as a dict name -> numpy array, is a classifier)."""
    model, inputs, classifier = build_model(name, batch)
    import torch
    with torch.no_grad():  # weights initialised to zeros (ViT's head) would make every output 0: compare nothing
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model, inputs, classifier


def build_model(name, batch):
    import torch
    torch.manual_seed(0)
    rng = np.random.default_rng(batch)
    if name in TORCHVISION:
        import torchvision
        model = getattr(torchvision.models, name)(weights=None).eval()
        return model, {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}, True
    if name == "transformer_encoder":
        layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True,
                                                 dropout=0.0)
        model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
        return model, {"x": rng.standard_normal((batch, 64, 128)).astype(np.float32)}, False
    if name in ("bert", "bert_mask"):
        import transformers
        config = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=512, max_position_embeddings=128)
        model = transformers.BertModel(config, add_pooling_layer=True).eval()
        ids = rng.integers(0, config.vocab_size, (batch, 32)).astype(np.int64)
        if name == "bert":
            return model, {"input_ids": ids}, False
        mask = np.ones((batch, 32), np.int64)
        mask[:, 24:] = 0  # padding: the last 8 positions of every row
        return model, {"input_ids": ids, "attention_mask": mask}, False
    if name == "distilbert":
        import transformers
        config = transformers.DistilBertConfig(vocab_size=1000, dim=128, n_layers=2, n_heads=4, hidden_dim=512,
                                               max_position_embeddings=128)
        model = transformers.DistilBertModel(config).eval()
        return model, {"input_ids": rng.integers(0, 1000, (batch, 32)).astype(np.int64)}, False
    if name == "gpt2":  # a decoder's forward as one graph pass (causal mask, learned positions), no KV cache
        import transformers
        config = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=4, n_positions=128,
                                         use_cache=False)
        model = transformers.GPT2Model(config).eval()
        return model, {"input_ids": rng.integers(0, 1000, (batch, 32)).astype(np.int64)}, False
    raise SystemExit(f"unknown model {name}: one of {','.join(TORCHVISION + OTHERS)}")


class Wrapped:
    """A module called with positional tensors named like the inputs (BERT's outputs: last hidden state and pooler)."""

    def __init__(self, model, names):
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *xs):
                out = self.m(**dict(zip(names, xs))) if names != ["x"] else self.m(*xs)
                if hasattr(out, "last_hidden_state"):  # (BERT's pooler too; DistilBERT and GPT-2 have none)
                    pooled = getattr(out, "pooler_output", None)
                    return (out.last_hidden_state, pooled) if pooled is not None else out.last_hidden_state
                return out
        self.module = M().eval()


def export(model, inputs, path, exporter):
    import torch
    names = list(inputs)
    wrapped = Wrapped(model, names).module
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    if exporter == "default":
        torch.onnx.export(wrapped, args, path, input_names=names)
    else:
        torch.onnx.export(wrapped, args, path, input_names=names, dynamo=False, opset_version=17)
    return wrapped


def onnx_facts(path):
    import onnx
    m = onnx.load(path, load_external_data=False)
    opset = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=0)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    return opset, ops, [o.name for o in m.graph.output]


def median_ms(fn, warmup=5, iters=30):
    """Median CUDA-event time of fn (ms): examples/resnet18's, the one timing rule of the ONNX comparisons."""
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "resnet18")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from resnet18 import median_ms as timed
    return timed(fn, warmup=warmup, iters=iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", default="build/tools/loom")
    ap.add_argument("--models", default=",".join(TORCHVISION + OTHERS))
    ap.add_argument("--batches", default="1")
    ap.add_argument("--exporter", choices=["default", "torchscript"], default="default")
    ap.add_argument("--backend", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--time", action="store_true", help="also time Loom, PyTorch eager and torch.compile")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--keep", default="", help="leave the exported files, inputs and outputs in this folder")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch
    work = args.keep or tempfile.mkdtemp(prefix="loom_zoo_")
    os.makedirs(work, exist_ok=True)
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, exporter {args.exporter}, backend "
          f"{args.backend}" + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""), flush=True)
    print("| model | batch | opset | ONNX ops | result | error vs onnxruntime | Loom ms | eager ms | compile ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            row = [name, str(batch)]
            stem = os.path.join(work, f"{name}_b{batch}")
            try:
                model, inputs, classifier = build(name, batch)
                wrapped = export(model, inputs, stem + ".onnx", args.exporter)
                opset, ops, out_names = onnx_facts(stem + ".onnx")
            except Exception as e:  # the exporter's failure is the row's result
                print(f"| {name} | {batch} | - | - | export failed: {str(e).splitlines()[0][:200]} | | | | |",
                      flush=True)
                continue
            row += [str(opset), f"{len(ops)} types, {sum(ops.values())} nodes"]
            print(f"<!-- {name} b{batch} ops: {', '.join(f'{k} {v}' for k, v in sorted(ops.items()))} -->", flush=True)
            specs = []
            for k, v in inputs.items():
                np.save(f"{stem}.{k}.npy", v)
                specs.append(f"{k}={stem}.{k}.npy")
            sess = ort.InferenceSession(stem + ".onnx", providers=["CPUExecutionProvider"])
            ref = sess.run(None, inputs)
            for o, r in zip(out_names, ref):
                np.save(f"{stem}.ref.{o}.npy", r)
            out = stem + ".out"
            os.makedirs(out, exist_ok=True)
            cmd = [args.loom, "run", f"--model={stem}.onnx", f"--input={','.join(specs)}", f"--backend={args.backend}",
                   f"--out={out}"] + ([f"--repeat={args.repeat}"] if args.time else [])
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                msg = " ".join((run.stderr.strip() or run.stdout.strip()).splitlines()[-3:])
                print("| " + " | ".join(row + [f"refused / failed (exit {run.returncode}): {msg[:600]}", "", "", "",
                                                 ""]) + " |", flush=True)
                continue
            errors, top1 = [], ""
            for o, r in zip(out_names, ref):
                path = os.path.join(out, f"{o}.npy")
                if not os.path.exists(path):
                    errors.append(f"{o}: missing")
                    continue
                y = np.load(path)
                errors.append(f"{o} {rel_rms(y, r):.1e}")
                if classifier and r.ndim == 2:
                    top1 = f", top-1 {np.mean(y.argmax(1) == r.argmax(1)):.2f}"
            loom_ms = eager = compiled = ""
            if args.time:
                m = re.search(r"pass in ([0-9.]+) ms", run.stdout)
                loom_ms = m.group(1) if m else "?"
                if torch.cuda.is_available():
                    gpu = wrapped.cuda()
                    xs = [torch.from_numpy(v).cuda() for v in inputs.values()]
                    with torch.no_grad():
                        eager = f"{median_ms(lambda: gpu(*xs), iters=args.repeat):.3f}"
                        try:
                            fast = torch.compile(gpu, mode="reduce-overhead")
                            compiled = f"{median_ms(lambda: fast(*xs), warmup=10, iters=args.repeat):.3f}"
                        except Exception as e:
                            compiled = f"failed: {str(e).splitlines()[0][:80]}"
                    wrapped.cpu()
            print("| " + " | ".join(row + ["ran", "; ".join(errors) + top1, loom_ms, eager, compiled]) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
