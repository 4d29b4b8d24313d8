"""Loom's exceptions. Every failure of the C++ runtime arrives as one of these, carrying its one-line message
(the bindings translate absl::Status codes into them)."""

from __future__ import annotations


class Error(RuntimeError):
    """A Loom error; the message is the runtime's."""


class InvalidArgumentError(Error, ValueError):
    """An argument, option, file, shape or state Loom refuses."""


class NotFoundError(Error, FileNotFoundError):
    """A file or preset that does not exist."""


class UnavailableError(Error):
    """No GPU Loom can run on (the message says why)."""


_INT32_MAX = 2**31 - 1


def check_int(value: object, name: str, low: int = 0, high: int = _INT32_MAX) -> int:
    """``value`` as an int in [low, high], or InvalidArgumentError naming ``name``. Floats (even 3.0) and bools are
    refused rather than truncated or taken for 1, and a value past the C++ type's range is refused here rather
    than reaching the bindings, whose conversion would raise a bare TypeError."""
    import operator

    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer, not a bool ({value})")
    try:
        number = operator.index(value)  # ints and numpy integers; not floats, not strings
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, not {type(value).__name__} ({value!r})") from None
    if not low <= number <= high:
        raise InvalidArgumentError(f"{name} = {number} is out of range [{low}, {high}]")
    return number
