"""Traces as pictures: a Chrome trace JSON of the megakernel (one track per SM, one slice per instruction)
rendered as a PNG timeline with matplotlib, one colour per opcode."""

from __future__ import annotations

import json
import os
from typing import Any


def render_png(trace_json: str | os.PathLike[str], png: str | os.PathLike[str], *, title: str = "",
               max_sms: int = 132) -> None:
    """Draws SMs (rows) against time (µs) with each instruction as a bar coloured by opcode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(trace_json, encoding="utf-8") as f:
        data = json.load(f)
    events: list[dict[str, Any]] = data["traceEvents"] if isinstance(data, dict) else data
    slices = [e for e in events if e.get("ph") == "X"]
    if not slices:
        raise ValueError(f"{os.fspath(trace_json)}: no instruction slices (ph 'X') to draw")
    t0 = min(float(e["ts"]) for e in slices)
    names = sorted({str(e.get("name", "?")) for e in slices})
    colours = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    by_row: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for e in slices:
        row = int(e.get("tid", 0))
        if row >= max_sms:
            continue
        by_row.setdefault(row, {}).setdefault(str(e.get("name", "?")), []).append(
            (float(e["ts"]) - t0, max(float(e.get("dur", 0.0)), 1e-3)))
    rows = max(by_row) + 1 if by_row else 1
    fig, ax = plt.subplots(figsize=(14, max(3.0, rows * 0.06 + 1.5)))
    for row, per_name in by_row.items():
        for name, spans in per_name.items():
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours[name], linewidth=0)
    ax.set_xlabel("time (µs)")
    ax.set_ylabel("SM")
    ax.set_ylim(-1, rows)
    ax.invert_yaxis()
    ax.set_title(title or os.path.basename(os.fspath(trace_json)))
    ax.legend(handles=[Patch(color=colours[n], label=n) for n in names], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
