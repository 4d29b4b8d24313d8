"""Traces as pictures: a Chrome trace JSON of the megakernel (``loom run --trace``, ``loom_bench --trace``,
``prefill_bench --trace``, ``Session.trace``: one track per SM, one slice per instruction) rendered as a PNG
timeline with matplotlib: SMs down, time across, one colour per opcode, the part of each instruction spent
waiting for its barriers in grey. ``step`` keeps one decode step, ``layer`` one layer's instructions (traces
written by this version name each instruction's op, e.g. ``layers.3.qkv``).

    python3 -m loom.trace trace.json timeline.png --step 2 --layer 7
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def load_slices(trace_json: str | os.PathLike[str], *, step: int | None = None,
                layer: int | None = None) -> list[dict[str, Any]]:
    """The instruction slices of a trace, optionally of one step and one layer."""
    with open(trace_json, encoding="utf-8") as f:
        data = json.load(f)
    events: list[dict[str, Any]] = data["traceEvents"] if isinstance(data, dict) else data
    slices = [e for e in events if e.get("ph") == "X"]
    if step is not None:
        slices = [e for e in slices if e.get("args", {}).get("step") == step]
    if layer is not None:
        if slices and not any("op" in e.get("args", {}) for e in slices):
            raise ValueError(f"{os.fspath(trace_json)}: the trace names no ops (written by an older loom): "
                             "cannot pick a layer")
        prefix = f"layers.{layer}."
        slices = [e for e in slices if str(e.get("args", {}).get("op", "")).startswith(prefix)]
    return slices


def render_png(trace_json: str | os.PathLike[str], png: str | os.PathLike[str], *, title: str = "",
               step: int | None = None, layer: int | None = None, max_sms: int = 1024) -> None:
    """Draws SMs (rows) against time in µs, each instruction a bar coloured by opcode, its wait in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    slices = load_slices(trace_json, step=step, layer=layer)
    if not slices:
        what = " of that step/layer" if step is not None or layer is not None else ""
        raise ValueError(f"{os.fspath(trace_json)}: no instruction slices (ph 'X'){what} to draw")
    t0 = min(float(e["ts"]) for e in slices)
    names = sorted({str(e.get("name", "?")) for e in slices})
    colours = {n: plt.get_cmap("tab10" if len(names) <= 10 else "tab20")(i % 20) for i, n in enumerate(names)}
    busy: dict[tuple[int, str], list[tuple[float, float]]] = {}
    waits: dict[int, list[tuple[float, float]]] = {}
    for e in slices:
        row = int(e.get("tid", 0))
        if row >= max_sms:
            continue
        start, dur = float(e["ts"]) - t0, max(float(e.get("dur", 0.0)), 1e-3)
        wait = min(max(float(e.get("args", {}).get("wait_us", 0.0)), 0.0), dur)
        if wait > 0:
            waits.setdefault(row, []).append((start, wait))
        busy.setdefault((row, str(e.get("name", "?"))), []).append((start + wait, dur - wait))
    rows = max(r for r, _ in busy) + 1
    fig, ax = plt.subplots(figsize=(14, min(40.0, max(3.0, rows * 0.07 + 1.5))))
    for row, spans in waits.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors="#d0d0d0", linewidth=0)
    for (row, name), spans in busy.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours[name], linewidth=0)
    ax.set_xlabel("time (µs)")
    ax.set_ylabel("SM")
    ax.set_ylim(rows, -1)
    label = title or os.path.basename(os.fspath(trace_json))
    if step is not None:
        label += f", step {step}"
    if layer is not None:
        label += f", layer {layer}"
    ax.set_title(label)
    handles = [Patch(color=colours[n], label=n) for n in names] + [Patch(color="#d0d0d0", label="waiting")]
    ax.legend(handles=handles, loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m loom.trace", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_json")
    ap.add_argument("png")
    ap.add_argument("--step", type=int, default=None, help="only this decode step (0-based)")
    ap.add_argument("--layer", type=int, default=None, help="only this layer's instructions")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    render_png(a.trace_json, a.png, title=a.title, step=a.step, layer=a.layer)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
