"""Compiling a model into a schedule, and schedules as files."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from . import _loom
from .errors import InvalidArgumentError, check_int
from ._wrap import NativeWrapper
from .model import Model, _as_array

# The keyword arguments of loom.compile: the `loom compile` flags of the same names.
_OPTIONS = ("options", "num_sms", "policy", "granularity", "unfuse", "max_seq", "prefill")


class Schedule(NativeWrapper):
    """A compiled schedule: per-SM queues of 128-byte instructions, barriers, tensors and the weight packing.

    ``summary()`` is what ``loom inspect`` prints; ``save`` / ``Schedule.load`` write and read schedule files
    (``.pbtxt`` text or binary ``.pb``). A schedule compiled here remembers its model, so ``loom.Session`` can
    run it; one read from a file needs ``model=`` with the weights it was compiled for.
    """

    def __init__(self, native: _loom.Schedule, model: Model | None = None) -> None:
        self._native = native
        self.model = model
        # resident graph passes, by (backend, model): the pass, its model, its inputs' dtypes
        self._passes: dict[tuple[str, int], tuple[Any, Model, dict[str, str]]] = {}
        self.last_ms = 0.0  # the last run()'s time

    @staticmethod
    def load(path: str | os.PathLike[str]) -> "Schedule":
        """Reads and verifies a schedule file (a hostile one is refused with an error, never run)."""
        return Schedule(_loom.Schedule.load(os.fspath(path)))

    def save(self, path: str | os.PathLike[str]) -> None:
        self._native.save(os.fspath(path))

    def run(self, inputs: Mapping[str, Any], *, backend: str = "auto", model: Model | None = None) -> dict[str, Any]:
        """Runs a compiled graph pass (an ONNX model's, or a ``Model.from_graph`` graph's) once on ``inputs``: name
        -> array (numpy, torch or nested lists; float32), every input of the graph. Returns the graph's outputs by
        name as numpy float32 arrays. ``backend``: "cpu" (the reference VM), "gpu", or "auto" (the GPU where there
        is one). The pass stays resident on its backend between runs; ``last_ms`` is the last run's time (GPU: the
        kernel's, by CUDA events). Decode schedules are run by ``loom.Session``.
        """
        model, backend = _model_and_backend(self, model, backend)
        if backend not in ("cpu", "gpu"):
            raise InvalidArgumentError(f"backend: unknown backend '{backend}' (cpu, gpu or auto)")
        key = (backend, id(model))
        if key not in self._passes:  # (the model is kept with it, so its id stays its own)
            dtypes = {t[0]: t[2] for t in model.graph().tensors() if t[3] == "INPUT"}  # (integer arrays: per input)
            self._passes[key] = (_loom.GraphPass(model._native, self._native, backend), model, dtypes)
        arrays = {name: _as_array(name, value, self._passes[key][2].get(name)) for name, value in inputs.items()}
        outputs, self.last_ms = self._passes[key][0].run(arrays)
        return dict(outputs)

    def summary(self, instructions: bool = False) -> str:
        """Instructions per opcode, per-SM load, the simulator's predicted step time (and every instruction)."""
        return self._native.summary(instructions)

    def __repr__(self) -> str:
        n = self._native
        return (f"loom.Schedule({n.model!r}: {n.num_instructions} instructions per step on {n.num_sms} SMs, "
                f"{n.num_barriers} barriers, KV cache {n.max_seq}, prefill {'on' if n.has_prefill else 'off'})")


def compile(model: Model, **options: Any) -> Schedule:  # noqa: A001 - the package's verb, as `loom compile`
    """Compiles ``model`` (from ``loom.load`` or ``Model.from_graph``) into a verified schedule.

    Options, as the ``loom compile`` flags (same values, same messages): ``options`` (a CompileOptions .pbtxt or
    .pb file the others override), ``num_sms``, ``policy`` ("round-robin", "lpt", "critical-path"),
    ``granularity`` ("op", "chunk"), ``unfuse`` (a list of, or comma-separated: "norm", "qkv", "residual",
    "silu", "argmax", "embed"), ``prefill`` (pack the one-pass prefill's weights; default where the graph has one),
    ``max_seq`` (must be the model's: it is fixed when loading).
    """
    if not isinstance(model, Model):
        raise TypeError(f"compile() takes a loom.Model, not {type(model).__name__}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise InvalidArgumentError(
            f"unknown option '{unknown[0]}' (options: {', '.join(_OPTIONS)})")
    unfuse = options.get("unfuse") or []
    if isinstance(unfuse, str):
        unfuse = [u for u in unfuse.split(",") if u]
    # Any int64 reaches the option parser the CLI shares, whose messages name the valid range.
    max_seq = check_int(options.get("max_seq") or 0, "max_seq", low=-2**63, high=2**63 - 1)
    num_sms = check_int(options.get("num_sms") or 0, "num_sms", low=-2**63, high=2**63 - 1)
    if max_seq and model.max_seq and max_seq != model.max_seq:
        raise InvalidArgumentError(
            f"max_seq: the model was loaded with a KV cache of {model.max_seq}; load it with max_seq={max_seq}")
    native = _loom.compile(model._native, os.fspath(options.get("options") or ""), num_sms,
                           str(options.get("policy") or ""), str(options.get("granularity") or ""),
                           [str(u) for u in _as_list(unfuse)], max_seq or model.max_seq, options.get("prefill"))
    return Schedule(native, model)


def _as_list(values: Iterable[Any]) -> list[Any]:
    return list(values)


def _model_and_backend(schedule: Schedule, model: Model | None, backend: str) -> tuple[Model, str]:
    """The model a schedule runs with (its own, or the one given for a schedule read from a file) and the backend
    "auto" means (the GPU where there is one)."""
    model = model or schedule.model
    if model is None:
        raise InvalidArgumentError(
            "this schedule was read from a file: pass model=loom.load(...) with the weights it was compiled for")
    if backend == "auto":
        backend = "gpu" if _loom.gpu_available()[0] else "cpu"
    return model, backend
