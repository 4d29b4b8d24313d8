"""Reads `loom quantize` output with compressed-tensors itself: each folder's quantization_config validates as the
library's QuantizationConfig, every other weight is the original's, and every projection the library decompresses
is within half a quantization step of the original bf16 weight (plus the bf16 roundings the format implies).

    loom export --model=random:tiny --out=/tmp/qx/base
    loom quantize --model=/tmp/qx/base --out=/tmp/qx/W4A16 --scheme=W4A16   (and FP8, W8A16, ...)
    /tmp/ct/bin/python tools/check_quantized_with_library.py /tmp/qx/base /tmp/qx/W4A16 ...
(compressed-tensors pulls in torch: a venv of its own, as tools/make_quantized_fixtures.py says.)
"""
import json, sys
import torch
from safetensors.torch import load_file
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.quantization import QuantizationConfig
base = load_file(sys.argv[1] + "/model.safetensors")
for folder in sys.argv[2:]:
    cfg = json.load(open(folder + "/config.json"))["quantization_config"]
    qc = QuantizationConfig.model_validate(cfg)
    scheme = qc.config_groups["group_0"]
    comp = BaseCompressor.load_from_registry(qc.format)
    stored = load_file(folder + "/model.safetensors")
    worst, n = 0.0, 0
    for name, w in base.items():
        module = name[:-len(".weight")]
        if not module.endswith("_proj"):
            assert torch.equal(stored[name], w), name
            continue
        parts = {k.split(".")[-1]: v for k, v in stored.items() if k.startswith(module + ".")}
        restored = comp.decompress(parts, scheme)["weight"].float()
        scale = parts["weight_scale"].float()
        g = scheme.weights.group_size or w.shape[1]
        step = scale.repeat_interleave(g, dim=1) if scale.shape[1] > 1 else scale
        err = (restored - w.float()).abs()
        if scheme.weights.type == "float":
            bound = w.float().abs() / 16 + step * 2**-9  # 3 mantissa bits: half an ulp is 1/16 of the value
        else:
            # clamped at the top (the bf16 scale may be 2^-8 below absmax / 7.5), the result rounded to bf16
            bound = step * (0.5 + 7.5 * 2**-8) + w.float().abs() * 2**-8
        assert bool((err <= bound * 1.0001).all()), (folder, name, float((err - bound).max()))
        worst = max(worst, float((err / step).max())); n += 1
    print(folder, qc.format, "projections", n, "worst error / scale %.3f" % worst, "OK")
