"""Progress bars (tqdm) for the runtime's long host work: loading, packing and uploading a large model."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import _loom


@contextlib.contextmanager
def progress_bars(enabled: bool = True) -> Iterator[None]:
    """While active, the runtime's progress (jobs over 256 MB) is drawn as tqdm bars on stderr."""
    if not enabled:
        yield
        return
    from tqdm.auto import tqdm

    bars: dict[str, Any] = {}

    def update(label: str, done: int, total: int, finished: bool) -> None:
        bar = bars.get(label)
        if bar is None:
            bar = bars[label] = tqdm(total=total, desc=label, unit="B", unit_scale=True, leave=True)
        bar.update(done - bar.n)
        if finished:
            bar.close()
            del bars[label]

    _loom.set_progress(update)
    try:
        yield
    finally:
        _loom.set_progress(None)
        for bar in bars.values():
            bar.close()
