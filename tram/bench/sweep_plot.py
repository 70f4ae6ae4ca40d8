"""The PNG of a `tram bench serve --sweep`: throughput and tail latencies against load, one line per
endpoint, so Tram and a peer measured with the same requests sit on the same axes.

matplotlib is imported here only, and only when a plot is drawn: the benchmark itself does not need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tram.bench.serve_metrics import percentile_name, value_text

_X_LABELS = {"concurrency": "max concurrency (requests in flight)", "rate": "request rate (req/s)"}


def plot_sweep(runs: Sequence[dict[str, Any]], path: str, title: str | None = None) -> str:
    """Draw output throughput, tail TTFT and tail ITL against the sweep values; returns `path`.

    The x axis is categorical (the sweep values in increasing order, evenly spaced): sweeps are usually
    geometric, and a rate sweep may end in `inf`, which no numeric axis can hold.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not runs:
        raise ValueError("no runs to plot")
    param = runs[0]["sweep"]["param"]
    values = sorted({r["sweep"]["value"] for r in runs})  # numeric order, inf last
    p = percentile_name(max(runs[0]["percentiles"]))
    panels = [
        ("output_throughput", "output tokens/s"),
        (f"{p}_ttft_ms", f"{p.upper()} TTFT (ms)"),
        (f"{p}_itl_ms", f"{p.upper()} ITL (ms)"),
    ]
    labels = list(dict.fromkeys(r["label"] for r in runs))

    # A Figure with its own Agg canvas, not pyplot: no global backend state, safe in any process.
    fig = Figure(figsize=(15, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels))
    for ax, (key, ylabel) in zip(axes, panels):
        for label in labels:
            pts = [(values.index(r["sweep"]["value"]), r.get(key)) for r in runs if r["label"] == label]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
        ax.set_xticks(range(len(values)), [value_text(v) for v in values])
        ax.set_xlabel(_X_LABELS.get(param, param))
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    if title is None:
        first = runs[0]
        title = f"{first.get('num_prompts')} requests, {first.get('endpoint')}"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
