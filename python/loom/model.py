"""Models: a decode graph with its weights, and for Hugging Face folders their tokenizer and chat template."""

from __future__ import annotations

import os
from typing import Any, Mapping

from . import _loom
from .errors import InvalidArgumentError, check_int
from ._wrap import NativeWrapper
from .progress import progress_bars
from .text import TextCodec


class Model(NativeWrapper):
    """A model Loom can compile: its graph, configuration and weights (``loom.load``, ``Model.from_graph``).

    Configuration fields (``family``, ``num_layers``, ``hidden_size``, ``num_heads``, ``num_kv_heads``,
    ``head_dim``, ``intermediate_size``, ``vocab_size``, ``parameters``) read through to the runtime's model.
    ``text`` is the folder's tokenizer and chat template, or None (``random:`` presets have none).
    """

    def __init__(self, native: _loom.Model, max_seq: int, text: TextCodec | None = None) -> None:
        self._native = native
        self.max_seq = max_seq
        self.text = text

    @property
    def spec(self) -> str:
        return self._native.spec

    @property
    def kv_dtype(self) -> str:
        """The KV caches' element: "f32" or "bf16" (load's kv_dtype); "" for a graph without a KV cache."""
        return self._native.kv_dtype

    @property
    def notes(self) -> list[str]:
        """What loading noticed: config fields transformers ignores for this family, weights rounded to bf16."""
        return list(self._native.notes)

    def __repr__(self) -> str:
        n = self._native
        if n.num_layers == 0:
            return f"loom.Model({self.spec!r}, graph)"
        size = f"{n.parameters / 1e9:.2f}B" if n.parameters >= 1e9 else f"{n.parameters / 1e6:.1f}M"
        return (f"loom.Model({self.spec!r}: {n.family}, {size} parameters, {n.num_layers} layers, "
                f"hidden {n.hidden_size}, {n.num_heads}/{n.num_kv_heads} heads of {n.head_dim}, "
                f"KV cache {self.max_seq}{' bf16' if self.kv_dtype == 'bf16' else ''})")

    def export(self, folder: str | os.PathLike[str]) -> None:
        """Writes config.json and model.safetensors (random:<preset> models): a folder transformers loads."""
        self._native.export(os.fspath(folder))

    def quantize(self, folder: str | os.PathLike[str], scheme: str, group_size: int = 128) -> None:
        """Writes the model quantized into ``folder`` as a compressed-tensors checkpoint (``loom quantize``).

        ``scheme``: "FP8" (e4m3, a scale per row), "W4A16" (int4, a scale per ``group_size`` columns) or "W8A16"
        (int8, a scale per row); round to nearest, symmetric; the LM head, embeddings and norms stay bf16.
        ``loom.load(folder)`` reads it back (FP8 and int4 computed with as stored, W8A16 widened to bf16).
        ``loom.quantize`` does the same from a spec, one weight in memory at a time.
        """
        check_int(group_size, "group_size", 1)
        self._native.quantize(os.fspath(folder), scheme, group_size)

    @staticmethod
    def from_graph(graph: _loom.Graph, weights: Mapping[str, Any]) -> "Model":
        """A model of a graph built with ``loom.GraphBuilder`` (or read with ``loom.Graph.load``).

        ``weights`` maps every WEIGHT tensor of the graph to an array of its shape: numpy arrays or torch
        tensors; floating values for bf16 and f32 weights (bf16 ones are rounded), integers for i32.
        """
        arrays = {name: _as_array(name, value, _dtype_of(graph, name)) for name, value in weights.items()}
        native = _loom.model_from_graph(graph, arrays)
        return Model(native, native.max_seq)

    def oracle(self) -> "Oracle":
        """The op-by-op float32 evaluator of the graph (every op, no schedule): the reference Loom is tested
        against. Its state tensors (KV caches) persist from run to run."""
        return Oracle(self)


class Oracle:
    """``model.oracle()``: ``run(inputs)`` evaluates every op once and returns the graph's outputs by name."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._native = _loom.Oracle(model._native)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        arrays = {name: _as_array(name, value, None) for name, value in inputs.items()}
        return dict(self._native.run(arrays))

    def get(self, name: str) -> Any:
        """Any input, state or activation tensor after the last run, as a numpy array."""
        return self._native.get(name)


def load(spec: str | os.PathLike[str], *, max_seq: int = 0, seed: int = 0x10057, weights: bool = True,
         progress: bool = True, scheme: str = "", widen_quantized: bool = False, kv_dtype: str = "f32") -> Model:
    """Loads ``random:<preset>`` (``llama-3.2-1b``, ``tiny``, ``tiny-mistral``, ``tiny-qwen2``, ``tiny-qwen3``:
    deterministic random weights) or a Hugging Face folder of a llama, mistral, qwen2 or qwen3 model
    (config.json and one or sharded safetensors; tokenizer.json and the chat template when present).

    ``max_seq`` is the KV-cache capacity in tokens (0: min(max_position_embeddings, 4096)); ``weights=False``
    reads the configuration and graph only (compiling needs no weights). A progress bar shows loading a large
    model when ``progress``. ``scheme="FP8"`` (``random:`` models) generates every projection as FP8 (e4m3, a
    power-of-two scale per row), ``scheme="W4A16"`` as symmetric int4 (a bf16 scale per 128 columns); a folder's
    FP8 weights (a scale per row or tensor) and int4 ones (compressed-tensors, bf16 scales per group) are computed
    with as stored unless ``widen_quantized``, which widens every quantized weight to bf16 as it is read.
    ``kv_dtype="bf16"`` keeps the KV cache in bf16 (half its memory and of what decode attention reads; K and V
    rounded to bf16 as they are appended); ``"f32"`` is the default.
    """
    spec = os.fspath(spec)
    if kv_dtype not in ("f32", "bf16"):
        raise ValueError(f"kv_dtype={kv_dtype!r}: 'f32' or 'bf16'")
    max_seq, seed = check_int(max_seq, "max_seq"), check_int(seed, "seed", high=2**64 - 1)
    if scheme not in ("", "FP8", "W4A16"):
        raise ValueError(f"scheme={scheme!r}: random weights are generated as 'FP8', 'W4A16' or bf16 ('')")
    if scheme and not spec.startswith("random:"):
        raise ValueError(f"scheme={scheme!r} generates random weights; a folder's weights are as its "
                         "config.json's quantization_config says")
    with progress_bars(progress):
        native = _loom.load_model(spec, max_seq, weights, seed, scheme, bool(widen_quantized), kv_dtype)
    text = None if spec.startswith("random:") else TextCodec.from_folder(spec)
    return Model(native, native.max_seq, text)


def quantize(spec: str | os.PathLike[str], folder: str | os.PathLike[str], scheme: str, group_size: int = 128, *,
             seed: int = 0x10057, progress: bool = True) -> None:
    """``loom quantize``: the model ``spec`` names (``random:<preset or config.json>`` or a Hugging Face folder)
    written quantized into ``folder`` as a compressed-tensors checkpoint, each weight quantized and written as it is
    read, so the host holds one weight at a time (a 70B folder's 141 GB of bf16 never at once); the file is bit for
    bit what ``loom.load(spec).quantize(folder, ...)`` writes. ``scheme``: "FP8", "W4A16" or "W8A16" (see
    ``Model.quantize``). A disk that cannot hold the result is refused before any weight is read.
    """
    check_int(group_size, "group_size", 1)
    seed = check_int(seed, "seed", high=2**64 - 1)
    with progress_bars(progress):
        _loom.quantize_checkpoint(os.fspath(spec), os.fspath(folder), scheme, group_size, seed)


def _dtype_of(graph: _loom.Graph, name: str) -> str | None:
    for tensor_name, _, dtype, _, _ in graph.tensors():
        if tensor_name == name:
            return dtype
    return None


def _as_array(name: str, value: Any, dtype: str | None) -> Any:
    """A numpy array of ``value`` (numpy, torch, or a nested list): float32 for floating data, int32 for
    integers; anything else is refused naming the tensor."""
    import numpy as np

    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.float()
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype.kind == "f":
        if dtype == "I32":
            raise InvalidArgumentError(f"tensor '{name}' is I32: pass integer values, not {array.dtype}")
        return np.ascontiguousarray(array, dtype=np.float32)
    if array.dtype.kind in "iu":
        if dtype in ("BF16", "F32"):  # (an ONNX integer input read in arithmetic is F32: exact up to 2^24)
            if array.size and np.abs(array).max() > 2**24:
                raise InvalidArgumentError(f"tensor '{name}': value {int(np.abs(array).max())} is past 2^24, which "
                                           "float32 holds inexactly")
            return np.ascontiguousarray(array, dtype=np.float32)
        if array.size and (array.min() < -2**31 or array.max() > 2**31 - 1):  # (a cast would wrap it silently)
            bad = int(array.max() if array.max() > 2**31 - 1 else array.min())
            raise InvalidArgumentError(f"tensor '{name}': value {bad} is outside int32")
        return np.ascontiguousarray(array, dtype=np.int32)
    raise InvalidArgumentError(f"tensor '{name}': cannot use an array of {array.dtype} (numbers only)")

