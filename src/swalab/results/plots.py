"""The report's figures: test error against epoch, the FGE members curve beside SWA, reliability diagrams.

Each figure is written as PNG and PDF (vector, for a paper). A legend names the model a line draws: a method's
own model (the SWA average, scored during training with ``model.swa.score_every``) apart from the iterate it
trains (the SGD iterate of a SWA or EMA run), and a curve over seeds is their mean with a band from the lowest
to the highest seed."""

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


def _title(ax, text: str, width: float) -> None:
    """``text`` as the title of a panel ``width`` inches wide, wrapped at its words so that it stays over its own
    panel (a row label with its settings can be longer than the panel; neighbours' titles must not run together)."""
    import textwrap

    chars = max(20, int(width * 0.77 * 10.5))  # 12 pt text, about 10.5 characters per inch, over the axes' width
    ax.set_title("\n".join(textwrap.wrap(text, chars, break_long_words=False, break_on_hyphens=False)))


def _plain_log_ticks(axis) -> None:
    """Tick labels of a log axis in plain numbers (1, 2, 5, 10, 20, 50), not 2×10^1."""
    import math

    from matplotlib.ticker import FuncFormatter

    def minor(v, _):  # within one decade every minor tick is labelled (30, 40, ...), else only 2 and 5
        low, high = sorted(axis.get_view_interval())
        shown = range(2, 10) if low > 0 and high / low < 10 else (2, 5)
        return f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in shown else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _panels(plt, n: int, width: float, height: float, across: int | None = None):
    """``n`` panels of ``width`` x ``height`` inches: in one row, or with ``across`` in rows of at most that many
    (a page-wide figure whose text stays legible), the last row's unused places left blank."""
    across = min(n, across or n)
    rows = -(-n // across)
    fig, axes = plt.subplots(rows, across, figsize=(width * across, height * rows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


def _finish(plt, fig, path: Path) -> None:
    """Save ``path`` (PNG) and the same figure as PDF beside it."""
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")  # tight: a legend placed beneath its axes is kept whole
    fig.savefig(path.with_suffix(".pdf"), bbox_inches="tight")
    plt.close(fig)


#: marker of the i-th curve group of a panel: lines that run together (an FGE or EMA run's iterate over the SGD
#: run of its seed until their schedules part) stay told apart, hollow markers showing through each other
MARKERS = "osD^vPX<>"
#: dash pattern of the i-th group's iterate (dashed: not the method's own model), each group's its own
DASHES = [(5, 2), (2, 1.5), (7, 2, 1.5, 2), (1, 1.5), (4, 1.5, 1.5, 1.5, 1.5, 1.5), (9, 3), (3, 3)]
BAND_ALPHA = 0.07  # a seed band's fill: bands of several curves laid over each other keep their own colours


def _mean_band(ax, points: dict[int, list[float]], style: str, label: str, color: str | None = None,
               marker: str = "o", dashes: tuple | None = None, under: int = 0):
    """The mean over seeds of ``{x: [value per seed]}``, with a band from the lowest to the highest seed, filled
    faintly and edged in the line's own colour. ``under`` curves drawn after this one: its line is that much wider
    and its marker larger, so that where later lines lie on it its edges still show."""
    from matplotlib.colors import to_rgba

    xs = sorted(points)
    mean = [statistics.fmean(points[x]) for x in xs]
    line, = ax.plot(xs, mean, style, marker=marker, ms=3.5 + 0.7 * under, mfc="none", mew=1.0,
                    lw=0.9 + 0.22 * under, label=label, color=color,
                    **({"dashes": dashes} if dashes and style != "-" else {}))
    if any(len(points[x]) > 1 for x in xs):
        ax.fill_between(xs, [min(points[x]) for x in xs], [max(points[x]) for x in xs],
                        facecolor=to_rgba(line.get_color(), BAND_ALPHA), edgecolor=to_rgba(line.get_color(), 0.45),
                        lw=0.5)
    return line


def scored_during_training(runs, split: str = "test") -> list[str]:
    """The history columns ``<predictor>_test_acc`` that methods logged while training (SWA's ``swa_test_acc``
    with ``model.swa.score_every``; ``swa_val_acc`` with ``split="val"``): their own models, scored beside the live
    one."""
    return sorted({k for run in runs for h in run.history for k in h if k.endswith(f"_{split}_acc")})


def iterate_label(method: str) -> str:
    """What the live model of a run of ``method`` is: the run's own predictor (SGD), or the iterate its method
    trains beside its own model (SWA's average, EMA's average, FGE's ensemble)."""
    return "" if method in ("sgd", "pretrained") else " · SGD iterate"


def monitored_split(runs) -> str | None:
    """``test`` when the runs' histories hold test scores per epoch, else ``val`` when they hold validation scores
    (``run.eval_split=val``), else None."""
    for split in ("test", "val"):
        if any(f"{split}_acc" in h for run in runs for h in run.history):
            return split
    return None


def plot_test_error(table: Table, path: Path) -> bool:
    """Test error (%) against epoch, log scale, per run of a row: the model a column scores where it was scored
    during training (SGD's run; SWA's average with ``model.swa.score_every``, ``<predictor>_test_acc``) solid, the
    iterate a method trains beside its own model dashed and named so; mean over seeds with a min-max band.
    Columns scored from the same runs (SWA 1B, 1.25B and 1.5B of one SWA run; SWA and SWAG of one SWAG run) are drawn
    once, named together; ``+ts`` columns have no curve of their own. Each group of columns has its own colour,
    hollow marker and dash pattern, so that lines lying on each other (an FGE run's iterate over the SGD run of its
    seed) stay visible; panels are two to a row. Runs monitored on the validation split (``run.eval_split=val``) draw
    its error instead, and the axis says so."""
    panels = [(row, curves) for row in table.rows if monitored_split(row.runs())
              for curves in [test_error_curves(row)] if any(len(points) > 1 for points, *_ in curves)]
    if not panels:  # a run scored only at its end (run.eval_every=0) has a point, not a curve
        return False
    plt = _pyplot()
    fig, axes = _panels(plt, len(panels), 5, 3.8, across=2)  # two across: 10 in, a page's width at legible text
    for ax, (row, curves) in zip(axes, panels):
        groups = len({color for *_, color in curves})
        for points, style, label, color in curves:
            group = int(color[1:])
            _mean_band(ax, points, style, label, color=color, marker=MARKERS[group % len(MARKERS)],
                       dashes=DASHES[group % len(DASHES)], under=min(groups - 1 - group, 5))
        what = "test error" if monitored_split(row.runs()) == "test" else "validation error"
        ax.set(xlabel="epoch", ylabel=f"{what} (%, log scale)", yscale="log")
        _title(ax, row.name, 5)
        _plain_log_ticks(ax.yaxis)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.24), frameon=False)  # beneath: never on a curve
    _finish(plt, fig, path)
    return True


def test_error_curves(row) -> list[tuple[dict, str, str, str]]:
    """``(points, line style, label, colour)`` per curve of a row's test-error panel (:func:`plot_test_error`):
    ``points`` maps an epoch to the error (%) of each seed's run scored there."""
    split = monitored_split(row.runs())
    groups: dict[tuple, list] = {}  # the same runs (one SWA run's budget columns) drawn once
    for column in sorted(row.cells, key=lambda c: c.order):
        if column.scaled:
            continue
        runs = tuple(sorted({str(e.run.path): e.run for e in row.cells[column].entries}.items()))
        groups.setdefault(runs, []).append(column)
    curves = []
    for i, (runs, columns) in enumerate(groups.items()):
        runs = [run for _, run in runs]
        longest = max(columns, key=lambda c: c.epochs)
        methods = list(dict.fromkeys(c.base for c in columns))
        name = longest.label if len(columns) == 1 else " · ".join(
            f"{next(c for c in columns if c.base == m).name} "
            f"{', '.join(f'{c.budget:g}B' for c in columns if c.base == m)}" for m in methods
        ) + f" ({longest.epochs} ep)"
        own = [k for k in scored_during_training(runs, split) if k in {f"{m}_{split}_acc" for m in methods}]
        series = [(key, f" · {key.removesuffix(f'_{split}_acc').upper()} model", "-") for key in own]
        iterate = any(m not in ("sgd", "pretrained") for m in methods)
        series.append((f"{split}_acc", iterate_label(methods[0]) if iterate else "", "--" if iterate else "-"))
        for key, suffix, style in series:
            points: dict[int, list[float]] = defaultdict(list)
            for run in runs:
                for h in run.history:
                    if key in h and int(h["epoch"]) <= longest.epochs:
                        points[int(h["epoch"])].append(max(100.0 - float(h[key]), 1e-2))
            if points:
                curves.append((points, style, f"{name}{suffix} (n={len(runs)})", f"C{i}"))
    return curves


def plot_fge_curve(table: Table, path: Path) -> bool:
    """FGE ensemble accuracy against the number of members (whole numbers), the mean over seeds with an error bar
    from the lowest to the highest seed; each SWA column of the FGE's budget B as a line (dashed: the mean, a light
    band: lowest to highest seed), by the rule of section 3.5 (:func:`swalab.results.diagnostics.same_budget`):
    SWA trained at another B is not drawn, and the legend says which B they had. One member is said in the legend:
    it is a single snapshot, not an ensemble."""
    from swalab.results.diagnostics import same_budget

    rows = [r for r in table.rows if any(c.method == "fge" and any(e.metrics.get("curve") for e in cell.entries)
                                         for c, cell in r.cells.items())]
    if not rows:
        return False
    plt = _pyplot()
    import textwrap

    from matplotlib.ticker import MaxNLocator

    fig, axes = _panels(plt, len(rows), 6, 4)
    for ax, row in zip(axes, rows):
        most, fges = 1, []
        for column, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order):
            if column.method != "fge" or not any(e.metrics.get("curve") for e in cell.entries):
                continue
            fges.append(column)
            points: dict[int, list[float]] = defaultdict(list)
            for e in cell.entries:
                for p in e.metrics.get("curve") or []:
                    points[int(p["members"])].append(float(p["acc"]))
            most = max([most, *points])
            xs = sorted(points)
            mean = [statistics.fmean(points[x]) for x in xs]
            spread = any(len(points[x]) > 1 for x in xs)
            single = " · 1 member: a single SGD snapshot, not an ensemble" if max(points, default=1) == 1 else ""
            ax.errorbar(xs, mean, yerr=[[m - min(points[x]) for m, x in zip(mean, xs)],
                                        [max(points[x]) - m for m, x in zip(mean, xs)]] if spread else None,
                        fmt="-o", ms=4, capsize=4, color=f"C{len(fges) - 1}",
                        label=f"{column.label} ensemble (n={len(cell.entries)}"
                              f"{', bar: lowest to highest seed' if spread else ''}){single}")
        kin = [(row, "")] + [(r, f" · {r.label}") for r in table.rows if r.shares_with is row]  # SWA of other settings
        swa = [(c, cell, tail) for r, tail in kin for c, cell in sorted(r.cells.items(), key=lambda kv: kv[0].order)
               if c.method == "swa"]
        drawn = [s for s in swa if any(same_budget(s[0], f) for f in fges)]
        for i, (column, cell, tail) in enumerate(drawn):
            values = cell.values("acc")
            color = f"C{len(fges) + i}"
            ax.axhline(statistics.fmean(values), color=color, ls="--",
                       label=f"{column.label} average{tail} (n={len(cell.entries)}"
                             f"{', band: lowest to highest seed' if len(values) > 1 else ''})")
            if len(values) > 1:
                ax.axhspan(min(values), max(values), color=color, alpha=0.1, lw=0)
        apart = sorted({c.epochs / c.budget for c, cell, tail in swa if (c, cell, tail) not in drawn and c.budget})
        if apart:
            fge_b = ", ".join(f"{f.epochs / f.budget:.3g}" for f in fges if f.budget)
            others = ", ".join(f"{b:.3g}" for b in apart)
            note, = ax.plot([], [], " ", label=textwrap.fill(
                f"SWA not drawn: trained at B = {others} ep, not the FGE's {fge_b} ep (compared only at the same B, "
                "as in section 3.5)", 90))
        ax.set(xlabel="ensemble members", ylabel="test accuracy (%)", xlim=(0.5, most + 0.5))
        _title(ax, row.name, 6)
        if most <= 12:  # every member count (MaxNLocator falls back to fractions when one whole number is in view)
            ax.set_xticks(range(1, most + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(handles)), key=lambda k: apart and handles[k] is note)  # the note beneath the lines
        ax.legend([handles[k] for k in order], [labels[k] for k in order], fontsize=8,
                  loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)  # beneath: no line hidden
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


SPARSE = 0.01  # a bin holding less than this share of the test images is drawn hollow and not joined


def reliability_columns(row, methods: Sequence[str] | None) -> list:
    """The columns of ``row`` a reliability panel draws: for each of ``methods`` (``sgd``, ``swa``, ``swag``, ``fge``,
    ``swa+ts``...) its column of the largest budget, in that order; without ``methods``, every column but the ``+ts``
    ones (a run with a validation split has one for each)."""
    ordered = sorted(row.cells, key=lambda c: c.order)
    if methods is None:
        return [c for c in ordered if not c.scaled]
    out = []
    for method in methods:
        found = [c for c in ordered if c.method == method]
        if found:
            out.append(max(found, key=lambda c: (c.budget, c.epochs)))
    return out


def plot_reliability(table: Table, path: Path, methods: Sequence[str] | None = None) -> bool:
    """Reliability diagrams, one panel per row: accuracy against mean confidence per bin (bins pooled over seeds,
    weighted by their counts), the legend giving each column's ECE and Brier score (means over seeds); bins holding
    under 1% of the images hollow and left out of the line, so a handful of images cannot make it jump; beneath,
    the share of images in each bin, and beneath that the legend, outside the axes (no bin is hidden behind it). A
    bin at accuracy 0 or 1 is drawn whole (the axis is padded, markers are not clipped). ``methods`` chooses the
    columns (:func:`reliability_columns`): ``sgd swa swag fge`` draws SGD, SWA, SWAG and FGE in one figure."""
    rows = [r for r in table.rows if any(run.reliability for run in r.runs()) and reliability_columns(r, methods)]
    if not rows:
        return False
    plt = _pyplot()
    entries = max(len(reliability_columns(r, methods)) for r in rows) + 1  # legend lines beneath the panels
    fig, grid = plt.subplots(2, len(rows), figsize=(5 * len(rows), 6.8 + 0.16 * entries), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex="col")
    for j, row in enumerate(rows):
        ax, hist = grid[0][j], grid[1][j]
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="perfect calibration")
        for i, column in enumerate(reliability_columns(row, methods)):
            cell = row.cells[column]
            bins = pooled_bins(cell.entries)
            total = sum(b["count"] for b in bins)
            if not total:
                continue
            color = f"C{i}"
            dense = [b for b in bins if b["count"] >= SPARSE * total]
            sparse = [b for b in bins if 0 < b["count"] < SPARSE * total]
            tail = "".join(f", {name} {statistics.fmean(cell.values(metric)):.3f}"
                           for metric, name in (("ece", "ECE"), ("brier", "Brier")) if cell.values(metric))
            ax.plot([b["conf"] for b in dense], [b["acc"] for b in dense], "-o", ms=4, color=color,
                    clip_on=not dense, label=f"{column.label} (n={len(cell.entries)}{tail})")
            # unclipped, a bin at accuracy 0 or 1 is drawn whole; an empty line unclipped would stretch the panel's
            # extent over the whole figure (tight_layout then gives up)
            if sparse:
                ax.plot([b["conf"] for b in sparse], [b["acc"] for b in sparse], "o", ms=4, mfc="none", color=color,
                        clip_on=False)
            edges = [bins[0]["lo"], *(b["hi"] for b in bins)]
            hist.stairs([max(b["count"] / total, 1e-4) for b in bins], edges, color=color, baseline=1e-4)
        ax.set(ylabel="accuracy", xlim=(0, 1), ylim=(-0.03, 1.03))  # a bin at accuracy 0 or 1 is drawn whole
        _title(ax, row.name, 5)
        ax.grid(alpha=0.3)
        # beneath the share of images, outside both axes: no bin hidden behind it
        hist.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45),
                    frameon=False, title="hollow: bins with < 1% of the images", title_fontsize=7)
        hist.set(xlabel="confidence", ylabel="share of images\n(log scale)", yscale="log", ylim=(1e-3, 1.5))
        hist.grid(alpha=0.3)
    _finish(plt, fig, path)
    return True
