"""The Python classes that wrap a C++ object of loom._loom."""

from __future__ import annotations

from typing import Any


class NativeWrapper:
    """Reads every attribute the Python class does not define through to its C++ object, ``self._native``."""

    _native: Any

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._native, name)
