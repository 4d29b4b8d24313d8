"""Writes tests/data/quantized/<scheme>/: a one-layer Llama checkpoint whose projections are quantized and stored by
the `compressed-tensors` library itself (its compressors write the tensors, its ModelCompressor the config), the way
llmcompressor publishes checkpoints on the hub, plus `reference.json`: an FNV-1a 64 hash of the bf16 weights the
library's own `decompress` gives back for every quantized projection, which Loom's reader must reproduce bit for bit.

Also `awq-g32`: the same model quantized the way AutoAWQ 0.2.9 stores it (its own `pseudo_quantize_tensor` rule
for scales and zero points, its `WQLinear_GEMM.from_linear` packing, `quant_method: "awq"` as its
`to_transformers_dict` writes it), an fp16 checkpoint; the reference is its own `dequantize_gemm`.

And `gptq-*`: packed by GPTQModel 7.7.0's `TorchLinear.pack` (round-to-nearest scales and zero points in GPTQ's
rule, no calibration; `gptq-desc-act-g32` with activation order: the columns grouped in a fixed permutation, g_idx), saved in the v1 `gptq` format through its own `convert_gptq_v2_to_v1_format_module` or as
`gptq_v2`; the reference is its own `dequantize_weight` after its v1-to-v2 conversion.

Regenerate (CPU; compressed-tensors pulls in torch; AutoAWQ's modules are imported from its source distribution,
not installed, as its package __init__ needs a GPU stack):
    python3 -m venv /tmp/ct && /tmp/ct/bin/pip install compressed-tensors accelerate
    /tmp/ct/bin/pip download --no-deps -d /tmp/awq autoawq==0.2.9 && tar xzf /tmp/awq/autoawq-0.2.9.tar.gz -C /tmp/awq
    BUILD_CUDA_EXT=0 /tmp/ct/bin/pip install gptqmodel==7.7.0
    AWQ_SRC=/tmp/awq/autoawq-0.2.9 /tmp/ct/bin/python tools/make_quantized_fixtures.py
"""
import json
import os
import pathlib
import shutil

import torch
from safetensors.torch import save_file
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "quantized"

SCHEMES = {
    # name: (format, QuantizationArgs)
    "w4a16-g32": ("pack-quantized", dict(num_bits=4, type="int", strategy="group", group_size=32, symmetric=True)),
    "w4a16-asym-g64": ("pack-quantized", dict(num_bits=4, type="int", strategy="group", group_size=64, symmetric=False)),
    "w8a16-channel": ("pack-quantized", dict(num_bits=8, type="int", strategy="channel", symmetric=True)),
    "fp8-channel": ("float-quantized", dict(num_bits=8, type="float", strategy="channel", symmetric=True)),
    # one scale for the whole tensor (the hub's static FP8 checkpoints store weights so)
    "fp8-tensor": ("float-quantized", dict(num_bits=8, type="float", strategy="tensor", symmetric=True)),
    # a float16 model's checkpoint: F16 scales, the library's decompress rounding in float16
    "w4a16-g32-f16": ("pack-quantized", dict(num_bits=4, type="int", strategy="group", group_size=32, symmetric=True)),
}


def base_model():
    config = json.loads((ROOT / "tests/data/hf_configs/transformers5/llama-3.2-1b.json").read_text())
    config.update(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  num_hidden_layers=1, vocab_size=256, tie_word_embeddings=False, max_position_embeddings=512)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    g = torch.Generator().manual_seed(44)
    d, inter, kv = 128, 256, 64

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": w(256, d), "lm_head.weight": w(256, d),
               "model.norm.weight": (1 + torch.randn(d, generator=g) * 0.1).to(torch.bfloat16)}
    p = "model.layers.0."
    weights[p + "input_layernorm.weight"] = (1 + torch.randn(d, generator=g) * 0.1).to(torch.bfloat16)
    weights[p + "post_attention_layernorm.weight"] = (1 + torch.randn(d, generator=g) * 0.1).to(torch.bfloat16)
    for name, shape in [("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (kv, d)), ("self_attn.v_proj", (kv, d)),
                        ("self_attn.o_proj", (d, d)), ("mlp.gate_proj", (inter, d)), ("mlp.up_proj", (inter, d)),
                        ("mlp.down_proj", (d, inter))]:
        weights[p + name + ".weight"] = w(*shape)
    return config, weights


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    config, weights = base_model()
    for name, (fmt, args) in SCHEMES.items():
        qargs = QuantizationArgs(**args)
        scheme = QuantizationScheme(targets=["Linear"], weights=qargs)
        compressor = BaseCompressor.load_from_registry(fmt)
        out, reference = {}, {}
        for tensor, value in weights.items():
            module = tensor[: -len(".weight")]
            if not module.endswith("_proj"):  # embeddings, norms and the ignored lm_head stay bf16
                out[tensor] = value
                continue
            x = value.float()
            if qargs.strategy == "group":
                grouped = x.unflatten(-1, (x.shape[1] // qargs.group_size, qargs.group_size))
                lo, hi = grouped.amin(-1), grouped.amax(-1)
            elif qargs.strategy == "tensor":
                lo, hi = x.amin().reshape(1), x.amax().reshape(1)
            else:
                lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
            scale, zero_point = calculate_qparams(lo, hi, qargs)
            dtype = torch.float16 if name.endswith("-f16") else torch.bfloat16
            state = {"weight": value.to(dtype), "weight_scale": scale.to(dtype)}
            if not qargs.symmetric:
                state["weight_zero_point"] = zero_point
            compressed = compressor.compress(state, scheme)
            for key, t in compressed.items():
                out[f"{module}.{key}"] = t.contiguous()
            restored = compressor.decompress(dict(compressed), scheme)["weight"]
            assert restored.dtype == dtype, restored.dtype
            # Loom computes from bf16: the library's weight rounded to nearest even, as torch's .to() does
            restored = restored.to(torch.bfloat16)
            reference[tensor] = fnv1a64(restored.contiguous().view(torch.int16).numpy().tobytes())
        folder = OUT / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        qconfig = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=["lm_head"],
                                     quantization_status="compressed")
        ModelCompressor(quantization_config=qconfig).update_config(str(folder))
        (folder / "reference.json").write_text(json.dumps(reference, indent=2, sort_keys=True) + "\n")
        print(folder, sorted({str(t.dtype) for t in out.values()}), os.path.getsize(folder / "model.safetensors"))


def fp16_split(weights):
    """An fp16 checkpoint's tensors kept as stored, and its projections as (tensor, module, fp16 weight)."""
    kept, projections = {}, []
    for tensor, value in weights.items():
        module = tensor[: -len(".weight")]
        if module.endswith("_proj"):
            projections.append((tensor, module, value.to(torch.float16)))
        else:
            kept[tensor] = value.to(torch.float16)
    return kept, projections


def write_fixture(name, out, reference, config):
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "reference.json").write_text(json.dumps(reference, indent=2, sort_keys=True) + "\n")
    print(folder, sorted({str(t.dtype) for t in out.values()}), os.path.getsize(folder / "model.safetensors"))


def awq_fixture(config, weights, group_size=32):
    import sys
    import types

    root = os.environ["AWQ_SRC"] + "/awq"
    for name, path in [("awq", root), ("awq.modules", root + "/modules"), ("awq.modules.linear", root + "/modules/linear"),
                       ("awq.utils", root + "/utils")]:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    out, projections = fp16_split(weights)
    reference = {}
    for tensor, module, w in projections:
        # AutoAWQ's pseudo_quantize_tensor (zero_point, 4 bits), then its packing of the quantized weight.
        rows, cols = w.shape
        g = w.float().reshape(-1, group_size)
        hi, lo = g.amax(dim=1, keepdim=True), g.amin(dim=1, keepdim=True)
        scales = (hi - lo).clamp(min=1e-5) / 15
        zeros = (-torch.round(lo / scales)).clamp_(0, 15)
        quantized = ((torch.clamp(torch.round(g / scales) + zeros, 0, 15) - zeros) * scales).reshape(rows, cols)
        linear = torch.nn.Linear(cols, rows, bias=False)
        linear.weight.data = quantized.to(torch.float16)
        q = WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales.view(rows, -1).t().contiguous(),
                                      zeros=zeros.view(rows, -1).t().contiguous())
        out[module + ".qweight"], out[module + ".qzeros"], out[module + ".scales"] = q.qweight, q.qzeros, q.scales
        restored = dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, group_size).t().contiguous()
        assert restored.dtype == torch.float16, restored.dtype
        reference[tensor] = fnv1a64(restored.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    write_fixture(f"awq-g{group_size}", out, reference, dict(config, torch_dtype="float16", quantization_config={
        "quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
        "modules_to_not_convert": None}))


def gptq_fixture(config, weights, name, bits, group_size, sym, checkpoint_format, desc_act=False):
    from gptqmodel import QuantizeConfig
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module, convert_gptq_v2_to_v1_format_module

    maxq = (1 << bits) - 1
    qconfig = QuantizeConfig(bits=bits, group_size=group_size, desc_act=desc_act, sym=sym)
    out, projections = fp16_split(weights)
    reference = {}
    for tensor, module, w in projections:
        rows, cols = w.shape
        g = cols if group_size == -1 else group_size
        # desc_act: the columns quantized in another order (here a fixed permutation), grouped in that order
        order = torch.randperm(cols, generator=torch.Generator().manual_seed(cols)) if desc_act else torch.arange(cols)
        g_idx = torch.empty(cols, dtype=torch.int32)
        g_idx[order] = torch.arange(cols, dtype=torch.int32) // g
        x = w.float()[:, order].reshape(rows, cols // g, g)
        lo, hi = x.amin(-1).clamp(max=0), x.amax(-1).clamp(min=0)
        if sym:  # GPTQ's symmetric rule: the range +-absmax, zero point 2^(bits-1)
            hi = torch.maximum(lo.abs(), hi)
            lo = -hi
        scale = ((hi - lo) / maxq).clamp(min=1e-8)
        zero = torch.full_like(scale, (maxq + 1) // 2) if sym else torch.round(-lo / scale)
        linear = torch.nn.Linear(cols, rows, bias=False)
        linear.weight.data = w
        args = dict(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, in_features=cols,
                    out_features=rows, bias=False)
        q = TorchLinear(**args)
        q.pack(linear, scale.half(), zero.to(torch.int32), g_idx)
        if checkpoint_format == "gptq":
            convert_gptq_v2_to_v1_format_module(q, qconfig)
        stored = {k: getattr(q, k).detach().clone() for k in ["qweight", "qzeros", "scales", "g_idx"]}
        for k, v in stored.items():
            out[f"{module}.{k}"] = v.contiguous()
        back = TorchLinear(**args)
        for k, v in stored.items():
            getattr(back, k).data = v.clone()
        if checkpoint_format == "gptq":
            convert_gptq_v1_to_v2_format_module(back, bits=bits, pack_dtype=torch.int32)
        back.post_init()
        restored = back.dequantize_weight().t().contiguous()
        assert restored.dtype == torch.float16, restored.dtype
        reference[tensor] = fnv1a64(restored.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    quantization = qconfig.to_dict()
    quantization.pop("meta", None)  # calibration bookkeeping (a temporary path)
    quantization["format"] = quantization["checkpoint_format"] = checkpoint_format
    write_fixture(name, out, reference, dict(config, torch_dtype="float16", quantization_config=quantization))


if __name__ == "__main__":
    main()
    if os.environ.get("AWQ_SRC"):
        awq_fixture(*base_model())
    if os.environ.get("GPTQ", "1") == "1":
        gptq_fixture(*base_model(), "gptq-g32-asym", 4, 32, False, "gptq")
        gptq_fixture(*base_model(), "gptq-v2-g64-sym", 4, 64, True, "gptq_v2")
        gptq_fixture(*base_model(), "gptq-8bit-channel", 8, -1, True, "gptq")
        gptq_fixture(*base_model(), "gptq-2bit-g32-asym", 2, 32, False, "gptq")
        gptq_fixture(*base_model(), "gptq-desc-act-g32", 4, 32, False, "gptq", desc_act=True)
