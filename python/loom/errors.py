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
