"""The report's figures: test error against epoch, the FGE members curve beside SWA, reliability diagrams.

Each figure is written as PNG and PDF (vector, for a paper), in the one style of ``swalab.style`` (a method's colour,
linear axes unless an order of magnitude is spanned, whole epochs, panels in a grid titled by what sets them apart).
A legend names the model a line draws: a method's own model (the SWA average, scored during training with
``model.swa.score_every``) apart from the iterate it trains (the SGD iterate of a SWA or EMA run), and a curve over
seeds is their mean with a band from the lowest to the highest seed, which the legend names."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from swalab import style
from swalab.results.table import Entry, Row, Table


def _titled(fig, axes, rows) -> None:
    """Each panel titled by what sets its row apart from the figure's other rows (never a path), the figure by what
    they all share (``swalab.style.panel_titles``)."""
    shared, own = style.panel_titles([r.title_items for r in rows])
    for ax, text in zip(axes, own):
        style.title(ax, text)
    style.suptitle(fig, shared)


def _band_handle(label: str = style.BAND):
    """A legend entry for the bands over seeds: a grey patch that says what a band is."""
    from matplotlib.patches import Patch

    return Patch(facecolor=(0.5, 0.5, 0.5, 0.15), edgecolor=(0.5, 0.5, 0.5, 0.6), lw=0.5, label=label)


#: marker of the i-th curve group of a panel: lines that run together (an FGE or EMA run's iterate over the SGD
#: run of its seed until their schedules part) stay told apart, hollow markers showing through each other
MARKERS = "osD^vPX<>"
#: dash pattern of the i-th group's iterate (dashed: not the method's own model), each group's its own
DASHES = [(5, 2), (2, 1.5), (7, 2, 1.5, 2), (1, 1.5), (4, 1.5, 1.5, 1.5, 1.5, 1.5), (9, 3), (3, 3)]
BAND_ALPHA = 0.07  # a seed band's fill: bands of several curves laid over each other keep their own colours


#: dash of the k-th SWA line of an FGE panel (a reliability panel's columns: ``style.SHADE_MARKERS``): SWA 1B, 1.25B
#: and 1.5B are shades of one green, which alone do not tell them apart (nor in a grey print)
SHADE_DASHES = ["--", (0, (1.5, 1.5)), (0, (7, 2, 1.5, 2)), (0, (3, 1))]


MARKS = 20  # markers on a curve at most: one per epoch of a 300-epoch run hides the line under them


def _mean_band(ax, points: dict[int, list[float]], style: str, label: str, color: str | None = None,
               marker: str = "o", dashes: tuple | None = None, under: int = 0, group: int = 0):
    """The mean over seeds of ``{x: [value per seed]}``, with a band from the lowest to the highest seed, filled
    faintly and edged in the line's own colour. ``under`` curves drawn after this one: its line is that much wider
    and its marker larger, so that where later lines lie on it its edges still show. A long curve carries at most
    :data:`MARKS` markers, the ``group``-th curve's shifted along it so that lines lying on each other show each
    their own."""
    from matplotlib.colors import to_rgba

    xs = sorted(points)
    mean = [statistics.fmean(points[x]) for x in xs]
    step = max(1, -(-len(xs) // MARKS))
    line, = ax.plot(xs, mean, style, marker=marker, ms=3.5 + 0.7 * under, mfc="none", mew=1.0,
                    markevery=((group * max(1, step // 3)) % step, step),
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
    """Test error (%) against epoch, per run of a row: the model a column scores where it was scored during training
    (SGD's run; SWA's average with ``model.swa.score_every``, ``<predictor>_test_acc``) solid, the iterate a method
    trains beside its own model dashed and named so; mean over seeds with a min-max band, named in the legend.
    Columns scored from the same runs (SWA 1B, 1.25B and 1.5B of one SWA run; SWA and SWAG of one SWAG run) are drawn
    once, named together; ``+ts`` columns have no curve of their own. Each group of columns has its method's colour,
    its own hollow marker and dash pattern, so that lines lying on each other (an FGE run's iterate over the SGD run
    of its seed) stay visible; the error axis is logarithmic only over an order of magnitude, and cut above the
    epochs past the first ones when those would squeeze the rest (:func:`error_range`); panels wrap three to a
    row. A row of a method's own settings without an SGD run (SWA branched off an SGD trunk) also draws the SGD run
    it is paired with, named by that run's settings. Runs monitored on the validation split (``run.eval_split=val``) draw its error instead, and the axis says so."""
    panels = [(row, curves) for row in table.rows if monitored_split(row.runs())
              for curves in [test_error_curves(row)] if any(len(points) > 1 for points, *_ in curves)]
    if not panels:  # a run scored only at its end (run.eval_every=0) has a point, not a curve
        return False
    plt = style.pyplot()
    fig, axes = style.panels(plt, len(panels))
    for ax, (row, curves) in zip(axes, panels):
        groups = len({group for *_, group in curves})
        banded = False
        for points, style_, label, color, group in curves:
            _mean_band(ax, points, style_, label, color=color, marker=MARKERS[group % len(MARKERS)],
                       dashes=DASHES[group % len(DASHES)], under=min(groups - 1 - group, 5), group=group)
            banded |= any(len(v) > 1 for v in points.values())
        what = "test error" if monitored_split(row.runs()) == "test" else "validation error"
        shown, top = error_range([points for points, *_ in curves])
        style.value_axis(ax, shown, f"{what} (%)" + ("\n(first epochs above the top)" if top else ""))
        if top:
            ax.set_ylim(top=top)
        ax.set_xlabel("epoch")
        style.whole_ticks(ax.xaxis)
        ax.grid(alpha=0.3, which="both")
        handles, _ = ax.get_legend_handles_labels()
        style.legend_beneath(ax, handles=[*handles, *([_band_handle()] if banded else [])])
    _titled(fig, axes, [row for row, _ in panels])
    style.finish(plt, fig, path)
    return True


FIRST_EPOCHS = 0.1  # the share of a curve's epochs whose error may rise above a test-error panel's top


def error_range(curves: Sequence[dict[int, list[float]]]) -> tuple[list[float], float | None]:
    """The errors a test-error panel's axis is fitted to, and the top it is cut at (None: not cut). The first
    epochs' error (80% after epoch 1) would squeeze the last epochs, where methods differ by a point, into a few
    pixels: when every error after the first :data:`FIRST_EPOCHS` of the epochs stays below half the highest, the
    axis ends a little above those, and its label says the first epochs run above the top."""
    last = max(x for points in curves for x in points)
    every = [v for points in curves for vs in points.values() for v in vs]
    later = [v for points in curves for x, vs in points.items() if x > FIRST_EPOCHS * last for v in vs]
    if not later or max(later) >= 0.5 * max(every):
        return every, None
    return later, max(later) + 0.1 * (max(later) - min(later))


def test_error_curves(row) -> list[tuple[dict, str, str, str, int]]:
    """``(points, line style, label, colour, group)`` per curve of a row's test-error panel (:func:`plot_test_error`):
    ``points`` maps an epoch to the error (%) of each seed's run scored there."""
    split = monitored_split(row.runs())
    cells = dict(row.cells)
    borrowed = {} if any(c.method == "sgd" for c in cells) else row.sgd_cells()
    cells.update(borrowed)  # a row of a method's own settings (SWA branched off an SGD trunk): its paired SGD too
    groups: dict[tuple, list] = {}  # the same runs (one SWA run's budget columns) drawn once
    for column in sorted(cells, key=lambda c: c.order):
        if column.scaled:
            continue
        runs = tuple(sorted({str(e.run.path): e.run for e in cells[column].entries}.items()))
        groups.setdefault(runs, []).append(column)
    curves = []
    shade = style.shades()  # a method's second group in a panel (its other settings): lighter
    for i, (runs, columns) in enumerate(groups.items()):
        runs = [run for _, run in runs]
        longest = max(columns, key=lambda c: c.epochs)
        methods = list(dict.fromkeys(c.base for c in columns))
        name = longest.label if len(columns) == 1 else " · ".join(
            f"{next(c for c in columns if c.base == m).name} "
            f"{', '.join(f'{c.budget:g}B' for c in columns if c.base == m)}" for m in methods
        ) + f" ({longest.epochs} ep)"
        if longest in borrowed:  # not this row's settings: say whose they are
            name += f" · {row.shares_with.label or 'the defaults'}"
        own = [k for k in scored_during_training(runs, split) if k in {f"{m}_{split}_acc" for m in methods}]
        series = [(key, f" · {key.removesuffix(f'_{split}_acc').upper()} model", "-") for key in own]
        iterate = any(m not in ("sgd", "pretrained") for m in methods)
        color = style.color_of(methods[0], shade(methods[0]))
        series.append((f"{split}_acc", iterate_label(methods[0]) if iterate else "", "--" if iterate else "-"))
        for key, suffix, line_style in series:
            points: dict[int, list[float]] = defaultdict(list)
            for run in runs:
                for h in run.history:
                    if key in h and int(h["epoch"]) <= longest.epochs:
                        points[int(h["epoch"])].append(max(100.0 - float(h[key]), 1e-2))
            if points:
                curves.append((points, line_style, f"{name}{suffix} (n={len(runs)})", color, i))
    return curves


def ensemble_curve(column, cell) -> bool:
    """Whether an FGE column has a curve to draw: members counted by its runs, two or more in one of them (one
    member is a single SGD snapshot, not an ensemble: the table says so, and no curve of one point is drawn)."""
    return column.method == "fge" and any(len(e.metrics.get("curve") or []) > 1 for e in cell.entries)


def _draw_fge_curves(ax, row: Row) -> tuple[list, int]:
    """Draw the curve of each FGE column of ``row`` that has one (:func:`ensemble_curve`): the mean over seeds, a bar
    from the lowest to the highest seed; return those columns and the most members drawn."""
    most, fges = 1, []
    for column, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order):
        if not ensemble_curve(column, cell):
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
        ax.errorbar(xs, mean, yerr=[[m - min(points[x]) for m, x in zip(mean, xs)],
                                    [max(points[x]) - m for m, x in zip(mean, xs)]] if spread else None,
                    fmt="-o", ms=4, capsize=4, color=style.color_of("fge", len(fges) - 1),
                    label=f"{column.label} ensemble (n={len(cell.entries)}"
                          f"{', bar: lowest to highest seed' if spread else ''})")
    return fges, most


def plot_fge_curve(table: Table, path: Path) -> bool:
    """FGE ensemble accuracy against the number of members (whole numbers), the mean over seeds with an error bar
    from the lowest to the highest seed; each SWA column of the FGE's budget B as a line (dashed: the mean, a light
    band: lowest to highest seed; each its own shade and dash), by the rule of section 3.5 (:func:`swalab.results.diagnostics.same_budget`):
    SWA trained at another B is not drawn, and the legend says which B they had. An FGE of one member has no curve
    (:func:`ensemble_curve`); a report of such FGE runs only has no FGE figure."""
    from swalab.results.diagnostics import same_budget

    rows = [r for r in table.rows if any(ensemble_curve(c, cell) for c, cell in r.cells.items())]
    if not rows:
        return False
    plt = style.pyplot()
    import textwrap

    fig, axes = style.panels(plt, len(rows))
    for ax, row in zip(axes, rows):
        fges, most = _draw_fge_curves(ax, row)
        kin = [(row, "")] + [(r, f" · {r.label}") for r in table.rows if r.shares_with is row]  # SWA of other settings
        swa = [(c, cell, tail) for r, tail in kin for c, cell in sorted(r.cells.items(), key=lambda kv: kv[0].order)
               if c.method == "swa"]
        drawn = [s for s in swa if any(same_budget(s[0], f) for f in fges)]
        for i, (column, cell, tail) in enumerate(drawn):
            values = cell.values("acc")
            color = style.color_of("swa", i)
            ax.axhline(statistics.fmean(values), color=color, ls=SHADE_DASHES[i % len(SHADE_DASHES)],
                       label=f"{column.label} average{tail} (n={len(cell.entries)}"
                             f"{', ' + style.BAND if len(values) > 1 else ''})")
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
        if most <= 12:  # every member count (MaxNLocator falls back to fractions when one whole number is in view)
            ax.set_xticks(range(1, most + 1))
        else:
            style.whole_ticks(ax.xaxis)
        style.enough_ticks(ax.yaxis)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(handles)), key=lambda k: apart and handles[k] is note)  # the note beneath the lines
        style.legend_beneath(ax, handles=[handles[k] for k in order], labels=[labels[k] for k in order])
    _titled(fig, axes, rows)
    style.finish(plt, fig, path)
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
    ones (a run with a validation split has one for each) and the post-hoc ones (``swalab.posthoc``, which write no
    reliability bins)."""
    ordered = sorted(row.cells, key=lambda c: c.order)
    if methods is None:
        return [c for c in ordered if not c.scaled and not c.posthoc]
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
    the share of images in each bin, and beneath that the legend (a method's second and third columns, a lighter
    shade of its colour, each with a marker of its own), outside the axes (no bin is hidden behind it). A
    bin at accuracy 0 or 1 is drawn whole (the axis is padded, markers are not clipped). ``methods`` chooses the
    columns (:func:`reliability_columns`): ``sgd swa swag fge`` draws SGD, SWA, SWAG and FGE in one figure."""
    rows = [r for r in table.rows if any(run.reliability for run in r.runs()) and reliability_columns(r, methods)]
    if not rows:
        return False
    plt = style.pyplot()
    entries = max(len(reliability_columns(r, methods)) for r in rows) + 1  # legend lines beneath the panels
    across = min(len(rows), style.ACROSS)
    lines = -(-len(rows) // across)
    fig = plt.figure(figsize=(style.PANEL[0] * across, (6.8 + 0.16 * entries) * lines), layout="constrained")
    grid = fig.add_gridspec(2 * lines, across, height_ratios=[3, 1] * lines)
    axes = []
    for j, row in enumerate(rows):
        ax = fig.add_subplot(grid[2 * (j // across), j % across])
        hist = fig.add_subplot(grid[2 * (j // across) + 1, j % across], sharex=ax)
        axes.append(ax)
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="perfect calibration")
        shade = style.shades()  # SWA 1B beside SWA 1.5B: one colour, the second lighter
        for column in reliability_columns(row, methods):
            cell = row.cells[column]
            bins = pooled_bins(cell.entries)
            total = sum(b["count"] for b in bins)
            if not total:
                continue
            k = shade(column.method)
            color = style.color_of(column.method, k)
            marker = style.SHADE_MARKERS[k % len(style.SHADE_MARKERS)]  # not a shade alone
            dense = [b for b in bins if b["count"] >= SPARSE * total]
            sparse = [b for b in bins if 0 < b["count"] < SPARSE * total]
            tail = "".join(f", {name} {statistics.fmean(cell.values(metric)):.3f}"
                           for metric, name in (("ece", "ECE"), ("brier", "Brier")) if cell.values(metric))
            dashes = "--" if column.scaled else "-"  # SWA+ts has SWA's colour: dashed, it stays apart from it
            ax.plot([b["conf"] for b in dense], [b["acc"] for b in dense], dashes, marker=marker, ms=4, color=color,
                    clip_on=not dense, label=f"{column.label} (n={len(cell.entries)}{tail})")
            # unclipped, a bin at accuracy 0 or 1 is drawn whole; an empty line unclipped would stretch the panel's
            # extent over the whole figure (tight_layout then gives up)
            if sparse:
                ax.plot([b["conf"] for b in sparse], [b["acc"] for b in sparse], marker, ms=4, mfc="none", color=color,
                        clip_on=False)
            edges = [bins[0]["lo"], *(b["hi"] for b in bins)]
            hist.stairs([max(b["count"] / total, 1e-4) for b in bins], edges, color=color, baseline=1e-4, ls=dashes)
        ax.set(ylabel="accuracy", xlim=(0, 1), ylim=(-0.03, 1.03))  # a bin at accuracy 0 or 1 is drawn whole
        ax.tick_params(labelbottom=False)  # the confidence axis is read beneath, on the share of images
        ax.grid(alpha=0.3)
        # beneath the share of images, outside both axes: no bin hidden behind it
        hist.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45),
                    frameon=False, title="hollow: bins with < 1% of the images", title_fontsize=7)
        hist.set(xlabel="confidence", ylabel="share of images\n(log scale)", yscale="log", ylim=(1e-3, 1.5))
        hist.grid(alpha=0.3)
    _titled(fig, axes, rows)
    style.finish(plt, fig, path)
    return True
