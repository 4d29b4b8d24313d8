"""Loom from Python: load a model, compile it into a megakernel schedule, and generate.

    import loom
    model = loom.load("random:tiny")                  # or a Hugging Face folder
    schedule = loom.compile(model, num_sms=8)         # the same options as `loom compile`
    session = loom.Session(schedule, backend="cpu")   # "gpu": the persistent megakernel
    out = session.generate([1, 2, 3], max_new_tokens=16)
    print(out.new_ids, out.text)

Everything runs in Loom's C++ runtime (the extension module ``loom._loom``); this package adds what Python
libraries do better: text through Hugging Face ``tokenizers``, chat templates through ``jinja2``, progress bars
through ``tqdm``, pictures through ``matplotlib``, arrays through numpy and DLPack. Errors are ``loom.Error``
exceptions carrying the runtime's one-line messages. Heavy imports happen on first use, not at ``import loom``.
"""

from __future__ import annotations

from . import _loom
from ._loom import DType, Graph, GraphBuilder
from .errors import Error, InvalidArgumentError, NotFoundError, UnavailableError
from .model import Model, load, quantize
from .schedule import Schedule, compile
from .session import Generation, Session, Token

__version__: str = getattr(_loom, "__version__")

__all__ = [
    "DType",
    "Error",
    "Generation",
    "Graph",
    "GraphBuilder",
    "InvalidArgumentError",
    "Model",
    "NotFoundError",
    "Schedule",
    "Session",
    "Token",
    "UnavailableError",
    "__version__",
    "compile",
    "gpu_available",
    "load",
    "quantize",
]


def gpu_available() -> tuple[bool, str]:
    """(True, "") when a Hopper GPU is present, else (False, the reason)."""
    ok, why = _loom.gpu_available()
    return bool(ok), str(why)
