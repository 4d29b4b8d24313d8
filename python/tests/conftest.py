"""Shared fixtures: a tiny model compiled once, and the `loom` command for comparisons with the C++ CLI."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import loom


def cli_path() -> str:
    """The `loom` command: $LOOM_CLI, the one installed beside this package, or the build tree's."""
    candidates = [os.environ.get("LOOM_CLI", ""), shutil.which("loom") or ""]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "build", "tools", "loom"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("the loom command is not built (set LOOM_CLI)")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def tiny() -> loom.Model:
    return loom.load("random:tiny", max_seq=64)


@pytest.fixture(scope="session")
def tiny_schedule(tiny: loom.Model) -> loom.Schedule:
    return loom.compile(tiny, num_sms=8)


def gpu_or_skip() -> None:
    ok, why = loom.gpu_available()
    if not ok:
        pytest.skip(f"GPU test: {why}")
