"""The report's figures: test error against epoch, the FGE members curve beside SWA, reliability diagrams."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from swalab.results.table import Entry, Table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.usetex"] = False
    import matplotlib.pyplot as plt

    return plt


def _panels(plt, n: int, width: float, height: float):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0]


def _finish(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scored_during_training(runs) -> list[str]:
    """The history columns ``<predictor>_test_acc`` that methods logged while training (SWA's ``swa_test_acc``
    with ``model.swa.score_every``): their own models, scored beside the live one."""
    return sorted({k for run in runs for h in run.history for k in h if k.endswith("_test_acc") and k != "test_acc"})


def plot_test_error(table: Table, path: Path) -> bool:
    """Test error (%) against epoch: mean over seeds per column, the live model solid, a method's own models
    scored during training (``<predictor>_test_acc``) dashed."""
    rows = [r for r in table.rows if any("test_acc" in h for run in r.runs() for h in run.history)]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = _panels(plt, len(rows), 6, 4)
    for ax, row in zip(axes, rows):
        for column in sorted(row.cells, key=lambda c: c.order):
            runs = [e.run for e in row.cells[column].entries]
            own = scored_during_training(runs)
            series = [("test_acc", " (live model)" if own else "", "-")]
            series += [(key, f" ({key.removesuffix('_test_acc')})", "--") for key in own]
            for key, suffix, style in series:
                points: dict[int, list[float]] = defaultdict(list)
                for run in runs:
                    for h in run.history:
                        if key in h and int(h["epoch"]) <= column.epochs:
                            points[int(h["epoch"])].append(100.0 - float(h[key]))
                if points:
                    epochs = sorted(points)
                    ax.plot(epochs, [statistics.fmean(points[e]) for e in epochs], style, marker="o", ms=3,
                            label=f"{column.label}{suffix}")
        ax.set(title=row.name, xlabel="epoch", ylabel="test error (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish(plt, fig, path)
    return True


def plot_fge_curve(table: Table, path: Path) -> bool:
    """FGE ensemble accuracy against the number of members; each SWA column's accuracy as a line."""
    rows = [r for r in table.rows if any(c.method == "fge" and any(e.metrics.get("curve") for e in cell.entries)
                                         for c, cell in r.cells.items())]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = _panels(plt, len(rows), 6, 4)
    for ax, row in zip(axes, rows):
        for column, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order):
            if column.method == "fge":
                points: dict[int, list[float]] = defaultdict(list)
                for e in cell.entries:
                    for p in e.metrics.get("curve") or []:
                        points[int(p["members"])].append(float(p["acc"]))
                ks = sorted(points)
                ax.plot(ks, [statistics.fmean(points[k]) for k in ks], marker="o", label=f"{column.label} ensemble")
        swa = [(c, cell) for c, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order) if c.method == "swa"]
        for i, (column, cell) in enumerate(swa):
            ax.axhline(statistics.fmean(cell.values("acc")), color=f"C{i + 1}", ls="--", label=f"{column.label} model")
        ax.set(title=row.name, xlabel="ensemble members", ylabel="test accuracy (%)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish(plt, fig, path)
    return True


def pooled_bins(entries: Sequence[Entry]) -> list[dict]:
    """Reliability bins of one column's predictor summed over its runs (counts add, accuracy/confidence weighted)."""
    acc: dict[int, list[float]] = {}
    for e in entries:
        for i, b in enumerate(e.run.reliability.get(e.predictor) or []):
            slot = acc.setdefault(i, [b["lo"], b["hi"], 0.0, 0.0, 0.0])
            if b.get("count"):
                slot[2] += b["count"]
                slot[3] += b["count"] * b["acc"]
                slot[4] += b["count"] * b["conf"]
    return [{"lo": lo, "hi": hi, "count": int(n), "acc": a / n if n else None, "conf": c / n if n else None}
            for _, (lo, hi, n, a, c) in sorted(acc.items())]


def plot_reliability(table: Table, path: Path) -> bool:
    """One panel per row: accuracy against confidence per column."""
    rows = [r for r in table.rows if any(run.reliability for run in r.runs())]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = _panels(plt, len(rows), 5, 5)
    for ax, row in zip(axes, rows):
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="perfect calibration")
        for column, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order):
            bins = [b for b in pooled_bins(cell.entries) if b["count"]]
            if bins:
                ax.plot([b["conf"] for b in bins], [b["acc"] for b in bins], marker="o", ms=3, label=column.label)
        ax.set(title=row.name, xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _finish(plt, fig, path)
    return True
