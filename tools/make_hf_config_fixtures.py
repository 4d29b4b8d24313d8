#!/usr/bin/env python3
"""Writes the config.json files of tests/data/hf_configs exactly as transformers writes them.

Each entry is a real checkpoint's configuration, built with transformers' own config class and saved with
save_pretrained; the file lands in tests/data/hf_configs/transformers<MAJOR>/<name>.json. Run it once with a
transformers 4.x and once with a 5.x (no torch needed):

  python3 -m venv /tmp/v4 && /tmp/v4/bin/pip install "transformers<5"
  python3 -m venv /tmp/v5 && /tmp/v5/bin/pip install "transformers>=5"
  /tmp/v4/bin/python tools/make_hf_config_fixtures.py && /tmp/v5/bin/python tools/make_hf_config_fixtures.py
"""
import json
import os
import sys
import tempfile

import transformers
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

MAJOR = int(transformers.__version__.split(".")[0])
CLASSES = {"llama": (LlamaConfig, "LlamaForCausalLM"), "mistral": (MistralConfig, "MistralForCausalLM"),
           "qwen2": (Qwen2Config, "Qwen2ForCausalLM"), "qwen3": (Qwen3Config, "Qwen3ForCausalLM")}
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def cfg(model_type, theta, rope=None, **kwargs):
    return model_type, theta, rope, kwargs


QWEN = dict(rms_norm_eps=1e-6, max_position_embeddings=32768, sliding_window=32768, use_sliding_window=False)
FIXTURES = {
    "smollm2-135m": cfg("llama", 100000.0, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                        max_position_embeddings=8192, rms_norm_eps=1e-5),
    "smollm2-1.7b": cfg("llama", 130000.0, hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
                        num_key_value_heads=32, intermediate_size=8192, vocab_size=49152, tie_word_embeddings=True,
                        max_position_embeddings=8192, rms_norm_eps=1e-5),
    "tinyllama-1.1b": cfg("llama", 10000.0, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=4, intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048,
                          rms_norm_eps=1e-5),
    "llama-3.2-1b": cfg("llama", 500000.0, LLAMA3, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                        tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5),
    "llama-3.2-3b": cfg("llama", 500000.0, LLAMA3, hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                        num_key_value_heads=8, head_dim=128, intermediate_size=8192, vocab_size=128256,
                        tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5),
    "llama-3.1-8b": cfg("llama", 500000.0, dict(LLAMA3, factor=8.0), hidden_size=4096, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                        max_position_embeddings=131072, rms_norm_eps=1e-5),
    "llama-linear-rope": cfg("llama", 10000.0, {"rope_type": "linear", "factor": 2.0}, hidden_size=256,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
                             vocab_size=1000, attention_bias=True, mlp_bias=True),
    "mistral-7b-v0.3": cfg("mistral", 1000000.0, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, vocab_size=32768, sliding_window=None,
                           max_position_embeddings=32768, rms_norm_eps=1e-5),
    "mistral-7b-v0.1": cfg("mistral", 10000.0, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, sliding_window=4096,
                           max_position_embeddings=32768, rms_norm_eps=1e-5),
    "qwen2.5-0.5b": cfg("qwen2", 1000000.0, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                        max_window_layers=24, **QWEN),
    "qwen2.5-1.5b": cfg("qwen2", 1000000.0, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                        num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                        max_window_layers=21, **QWEN),
    "qwen2.5-7b-yarn": cfg("qwen2", 1000000.0, {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32768},
                           hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                           intermediate_size=18944, vocab_size=152064, max_window_layers=28, **QWEN),
    "qwen3-0.6b": cfg("qwen3", 1000000.0, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                      tie_word_embeddings=True, max_window_layers=28, **dict(QWEN, max_position_embeddings=40960)),
    "qwen3-1.7b": cfg("qwen3", 1000000.0, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, intermediate_size=6144, vocab_size=151936,
                      tie_word_embeddings=True, max_window_layers=28, **dict(QWEN, max_position_embeddings=40960)),
    "qwen3-8b": cfg("qwen3", 1000000.0, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
                    max_window_layers=36, **dict(QWEN, max_position_embeddings=40960)),
}


def main():
    out_dir = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf_configs", f"transformers{MAJOR}")
    os.makedirs(out_dir, exist_ok=True)
    for name, (model_type, theta, rope, kwargs) in FIXTURES.items():
        kwargs = dict(kwargs, torch_dtype="bfloat16") if MAJOR < 5 else dict(kwargs, dtype="bfloat16")
        if MAJOR >= 5:
            kwargs["rope_parameters"] = dict(rope or {"rope_type": "default"}, rope_theta=theta)
        else:
            kwargs["rope_theta"] = theta
            kwargs["rope_scaling"] = rope
        config_class, architecture = CLASSES[model_type]
        config = config_class(architectures=[architecture], **kwargs)
        with tempfile.TemporaryDirectory() as tmp:
            config.save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                text = f.read()
        json.loads(text)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            f.write(text)
    print(f"transformers {transformers.__version__}: {len(FIXTURES)} files in {os.path.normpath(out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
