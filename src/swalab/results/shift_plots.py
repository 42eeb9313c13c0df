"""The report's figures of runs scored under shift (``python -m swalab.results.score``, ``<run>/scores/``,
docs/shift.md): accuracy and ECE against corruption severity, and ROC curves of out-of-distribution detection.

Both are drawn per row of the report's table (a dataset, a model and the settings they share), each predictor in its
column's colour (``swalab.style.color_of``: SWA is the same green here as in the test-error curves), over the seeds of
its cell:

* ``shift_corruptions.png``: per row, an accuracy panel and an ECE panel against severity (Ovadia et al. 2019, their
  figure 1): at each severity 1 to 5 a box per predictor over the corruptions every seed of every predictor of the
  panel was scored on (the same corruptions in every box of a severity; the legend counts those scored for some
  predictors only, which no box holds), each corruption's value first the mean over
  the seeds; at "clean", the uncorrupted test set (``scores/test`` where the run was scored on it
  again, else the run's own ``metrics.json``: the same numbers), one marker.
* ``ood_roc.png``: per row and OOD set, the ROC curve of each predictor and score (``msp``: 1 - the maximum softmax
  probability, and ``mutual_information`` of an ensemble with saved members; ``entropy`` when asked: the report's
  ``--roc-scores``), OOD images the positives,
  from the per-image scores kept beside the OOD record (``swalab.results.ood.PER_IMAGE_FILE``); over several seeds
  the mean true positive rate at each false positive rate (vertical averaging, Fawcett 2006). The legend gives the
  AUROC of ``metrics.json`` (from full-precision scores; mean ± std over seeds). Columns scored on other versions of
  one OOD folder (it changed between the score commands of their runs: the records' fingerprints) are drawn in a
  panel per version, its title naming the images' fingerprint, never in one. An OOD record scored before the
  per-image scores were kept draws no curve, and :func:`roc_missing` says so in one line."""

from __future__ import annotations

import statistics
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

from swalab import style
from swalab.results import ood
from swalab.results.table import Cell, Column, Row, Table, mean_pm
from swalab.rundir import RunDir

CORRUPTED = "cifar10c-"  # the folder of a corrupted set: scores/cifar10c-<corruption>-<severity>
OOD = "ood-"             # the folder of an OOD record: scores/ood-<name>
SEVERITIES = (1, 2, 3, 4, 5)
CLEAN = 0                # the clean test set's place on the severity axis
#: the corruption figure's two panels per row: metric, axis label
CORRUPTION_METRICS = (("acc", "accuracy (%)"), ("ece", "ECE (15 equal-width bins)"))
CORRUPTION_TITLES = {"acc": "accuracy", "ece": "calibration"}
LEGEND_LINE = 0.15  # inches a line of a legend in 7 pt takes
LEGEND_CHARS = 48  # a legend line to the right of a panel, wrapped at its words
#: the OOD scores a ROC panel can draw, in this order, each with its line style and legend name
ROC_SCORES = {"msp": ("-", "MSP"), "entropy": ("--", "entropy"), "mutual_information": (":", "mutual information")}
#: those it draws unless told (``--roc-scores``): MSP of every predictor, mutual information where stored (an
#: ensemble's); entropy ranks images much as MSP does and would double the curves
DEFAULT_ROC_SCORES = ("msp", "mutual_information")
ROC_LEGEND = "MSP: 1 - max. softmax probability"
ROC_SEEDS = "; over seeds: the mean TPR at each FPR,\nAUROC mean ± std (n seeds)"
ROC_GRID = np.linspace(0.0, 1.0, 201)  # the false positive rates of a ROC curve averaged over seeds


# -- under corruption ------------------------------------------------------------------------------------------------
def corrupted_records(run) -> dict[tuple[str, int], dict]:
    """``{(corruption, severity): {predictor: metrics}}`` of a run's corrupted test sets."""
    out = {}
    for name, record in run.scores.items():
        data = record.get("data") or {}
        if name.startswith(CORRUPTED) and data.get("corruption") and data.get("severity"):
            out[(str(data["corruption"]), int(data["severity"]))] = record["predictors"]
    return out


def clean_metrics(entry) -> dict:
    """An entry's predictor on the clean test set: ``scores/test`` where the run was scored on it again, else the
    run's own ``metrics.json`` (the same numbers)."""
    again = ((entry.run.scores.get("test") or {}).get("predictors") or {}).get(entry.predictor)
    return again or entry.metrics


def shared_sets(cell: Cell) -> list[tuple[str, int]]:
    """The ``(corruption, severity)`` sets every seed of ``cell`` was scored on for its predictor."""
    sets = None
    for entry in cell.entries:
        own = {key for key, predictors in corrupted_records(entry.run).items() if entry.predictor in predictors}
        sets = own if sets is None else sets & own
    return sorted(sets or ())


def common_sets(cells: Sequence[Cell]) -> list[tuple[str, int]]:
    """The ``(corruption, severity)`` sets every seed of every one of ``cells`` was scored on: what a table that sets
    the cells side by side may average over."""
    sets = None
    for cell in cells:
        own = set(shared_sets(cell))
        sets = own if sets is None else sets & own
    return sorted(sets or ())


def left_out(cells: Sequence[Cell], common: Sequence[tuple[str, int]]) -> dict[int, int]:
    """``{severity: corruptions}`` some predictor of a panel was scored on but not every one, which its boxes leave out
    (a severity's boxes are over the same corruptions): the legend names them, so that a severity scored for some
    predictors only (SWAG not scored at severity 3) is not read as never scored."""
    scored = set().union(*(shared_sets(cell) for cell in cells))
    counts: dict[int, int] = defaultdict(int)
    for _, severity in scored - set(common):
        counts[severity] += 1
    return dict(sorted(counts.items()))


def severity_values(cell: Cell, metric: str, sets: Sequence[tuple[str, int]] | None = None) -> dict[int, list[float]]:
    """``{severity: [one value per corruption]}`` of a cell over ``sets`` (default: those every seed of the cell was
    scored on), each value the mean over the seeds, and at :data:`CLEAN` the clean test set's (mean over seeds); empty
    where none was scored under corruption."""
    keep = set(shared_sets(cell) if sets is None else sets)
    per: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in cell.entries:
        for key, predictors in corrupted_records(e.run).items():
            if key in keep and metric in (predictors.get(e.predictor) or {}):
                per[key].append(float(predictors[e.predictor][metric]))
    out: dict[int, list[float]] = defaultdict(list)
    for (_, severity), values in sorted(per.items()):
        out[severity].append(statistics.fmean(values))
    clean = [float(clean_metrics(e)[metric]) for e in cell.entries if metric in clean_metrics(e)]
    if out and clean:
        out[CLEAN] = [statistics.fmean(clean)]
    return dict(out)


def corrupted_columns(row: Row) -> list[tuple[Column, Cell]]:
    """The columns of ``row`` scored under corruption, in the table's order."""
    return [(c, row.cells[c]) for c in sorted(row.cells, key=lambda c: c.order)
            if severity_values(row.cells[c], "acc")]


def _colours(columns) -> list[str]:
    """Each column's colour: its method's, a lighter shade for the method's second column in a panel (SWA+ts beside
    SWA, SWA 1B beside SWA 1.5B)."""
    shade = style.shades()
    return [style.color_of(column.method, shade(column.base)) for column in columns]


def _boxes(ax, values: dict[int, list[float]], offset: float, width: float, color: str) -> None:
    """One predictor's boxes at severities 1..5 (shifted by ``offset``) and its clean marker."""
    from matplotlib.colors import to_rgba

    shown = [s for s in SEVERITIES if values.get(s)]
    if shown:
        ax.boxplot([values[s] for s in shown], positions=[s + offset for s in shown], widths=width,
                   patch_artist=True, manage_ticks=False,
                   boxprops={"facecolor": to_rgba(color, 0.3), "edgecolor": color, "lw": 0.9},
                   whiskerprops={"color": color, "lw": 0.9}, capprops={"color": color, "lw": 0.9},
                   medianprops={"color": "black", "lw": 1.1},  # the median read on a light box too
                   flierprops={"marker": "o", "ms": 2.5, "mfc": "none", "mec": color, "mew": 0.7})
    single = [s for s in shown if len(values[s]) == 1]  # a box of no height: its black median says not whose it is
    if single:
        ax.plot([s + offset for s in single], [values[s][0] for s in single], "s", ls="none", ms=4, color=color,
                zorder=3)
    if values.get(CLEAN):
        ax.plot([CLEAN + offset], values[CLEAN], "D", ms=4.5, color=color)


def _corruption_legend(columns, colours, counts: set[int], left: dict[int, int]) -> list:
    """The legend of a corruption panel: a patch per predictor, then what a box and the clean marker are, and what
    was scored but not drawn (``left``: :func:`left_out`)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=style.to_hex(c) + "4d", edgecolor=c, label=f"{column.label} (n={len(cell.entries)} "
                     f"seed{'s' if len(cell.entries) > 1 else ''})") for (column, cell), c in zip(columns, colours)]
    many = f"{min(counts)}" + (f" to {max(counts)}" if len(counts) > 1 else "")
    one = "; a square in its colour: one corruption" if 1 in counts else ""
    handles.append(Line2D([], [], ls="none", marker="s", mfc="none", mec="grey", label=textwrap.fill(
        f"box: the {many} corruption{'' if counts == {1} else 's'} at a severity, each the mean over seeds (black: "
        f"the median; quartiles, whiskers to 1.5 IQR, circles beyond{one})", LEGEND_CHARS)))
    handles.append(Line2D([], [], ls="none", marker="D", ms=4.5, color="grey",
                          label=textwrap.fill("clean: the uncorrupted test set (mean over seeds)", LEGEND_CHARS)))
    if left:
        said = ", ".join(f"{n}{'' if k else ' corruptions'} at severity {s}" for k, (s, n) in enumerate(left.items()))
        handles.append(Line2D([], [], ls="none", label=textwrap.fill(
            f"not drawn: {said}, scored for some predictors only", LEGEND_CHARS)))
    return handles


def _corruption_panel(ax, columns, metric: str, label: str, legend: bool) -> None:
    """One row's panel of ``metric`` against severity, all its predictors side by side at each severity; with
    ``legend``, the row's legend to its right (one per row: both panels draw the same predictors)."""
    colours = _colours([c for c, _ in columns])
    width = 0.8 / len(columns)
    counts = set()
    common = common_sets([cell for _, cell in columns])  # every box of the panel over the same corruptions
    for k, ((column, cell), color) in enumerate(zip(columns, colours)):
        values = severity_values(cell, metric, common)
        counts |= {len(v) for s, v in values.items() if s != CLEAN}
        _boxes(ax, values, (k - (len(columns) - 1) / 2) * width, width * 0.85, color)
    ax.set_xticks([CLEAN, *SEVERITIES], ["clean", *map(str, SEVERITIES)])
    ax.set(xlim=(-0.6, max(SEVERITIES) + 0.6), xlabel="corruption severity", ylabel=label)
    style.enough_ticks(ax.yaxis)
    ax.grid(alpha=0.3, axis="y")
    if legend:
        left = left_out([cell for _, cell in columns], common)
        ax.legend(handles=_corruption_legend(columns, colours, counts or {0}, left), fontsize=7, frameon=False,
                  loc="upper left", bbox_to_anchor=(1.03, 1.0))


def plot_shift_corruptions(table: Table, path: Path) -> bool:
    """Accuracy and ECE against corruption severity (module doc), two panels per row of ``table`` whose runs were
    scored under corruption, a row of the figure each; False (nothing drawn) when none was."""
    rows = [(row, columns) for row in table.rows for columns in [corrupted_columns(row)] if columns]
    if not rows:
        return False
    plt = style.pyplot()
    fig, axes = style.panels(plt, 2 * len(rows), across=2)
    if len(rows) == 1:  # the row is the figure's title; its panels are titled by what they show
        shared, own = ", ".join(rows[0][0].title_items), [""]
    else:
        shared, own = style.panel_titles([row.title_items for row, _ in rows])
    for i, ((row, columns), text) in enumerate(zip(rows, own)):
        for k, (ax, (metric, label)) in enumerate(zip(axes[2 * i:2 * i + 2], CORRUPTION_METRICS)):
            _corruption_panel(ax, columns, metric, label, legend=k == 1)
            style.title(ax, f"{text} · {CORRUPTION_TITLES[metric]}" if text else CORRUPTION_TITLES[metric])
    style.suptitle(fig, ", ".join(filter(None, [shared, "the test split corrupted (CIFAR-10-C-style)"])))
    style.finish(plt, fig, path)
    return True


# -- out-of-distribution detection ------------------------------------------------------------------------------------
def ood_names(row: Row) -> list[str]:
    """The OOD sets (``ood-<name>``) any run of ``row`` was scored against."""
    return sorted({name for run in row.runs() for name in run.scores if name.startswith(OOD)})


def kept_scores(run, name: str, read: dict) -> dict | None:
    """The per-image scores of one OOD record of ``run`` (``read``: the files read so far, one read per file)."""
    path = Path(run.path) / RunDir.SCORES / name / ood.PER_IMAGE_FILE
    if path not in read:
        read[path] = ood.read_kept_scores(path)
    return read[path]


def mean_roc(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One ROC curve as it is, or several (seeds) averaged vertically: the mean true positive rate at each false
    positive rate of :data:`ROC_GRID` (each curve read at its highest rate there), from (0, 0)."""
    if len(curves) == 1:
        return curves[0]
    tprs = []
    for fpr, tpr in curves:
        fpr_u, last = np.unique(fpr[::-1], return_index=True)  # the highest tpr at each fpr (tpr grows along fpr)
        tprs.append(np.interp(ROC_GRID, fpr_u, tpr[::-1][last]))
    return np.concatenate([[0.0], ROC_GRID]), np.concatenate([[0.0], np.mean(tprs, axis=0)])


def images_of(cell: Cell, name: str) -> set[str]:
    """The fingerprints of the images the cell's seeds were scored against under the name ``name`` (their records'):
    one, unless the folder changed between two score commands."""
    return {((e.run.scores.get(name) or {}).get("data") or {}).get("fingerprint") for e in cell.entries} - {None}


def other_images(cell: Cell, name: str) -> bool:
    """Whether the cell's seeds were scored against other images under the one name ``name`` (a folder that changed
    between two score commands: the records' image fingerprints differ), so that no mean of them is one set's."""
    return len(images_of(cell, name)) > 1


def image_versions(row: Row, name: str) -> list[str | None]:
    """The versions of ``name``'s images the row's columns were scored against, a panel each (a folder that changed
    between the score commands of other runs: no panel compares columns on other images); ``[None]``, one panel of
    every column, where they agree (or recorded none)."""
    found = dict.fromkeys(f for cell in row.cells.values() if not other_images(cell, name)
                          for f in images_of(cell, name))
    return list(found) if len(found) > 1 else [None]


def images_label(images: str | None) -> str:
    """``, images <8 hex>``: which version of an OOD set's images a panel or a summary line holds, where a row's
    columns were scored on several (:func:`image_versions`); nothing for None."""
    return f", images {images[:8]}" if images else ""


def panel_columns(row: Row, name: str, images: str | None) -> list[Column]:
    """The row's columns in the panel of ``name``'s images ``images`` (:func:`image_versions`; None: every column)."""
    return [c for c in sorted(row.cells, key=lambda c: c.order)
            if images is None or images_of(row.cells[c], name) == {images}]


def roc_curves(cell: Cell, name: str, read: dict, scores=DEFAULT_ROC_SCORES,
               ) -> dict[str, tuple[np.ndarray, np.ndarray, list[float], int]]:
    """``{score: (fpr, tpr, [AUROC per seed], seeds drawn)}`` of a cell's predictor against the OOD set ``name``, for
    each of ``scores`` stored, over the seeds whose per-image scores were kept; none where the seeds were scored on
    other images (:func:`other_images`: the report's summary says so)."""
    if other_images(cell, name):
        return {}
    curves: dict[str, list] = defaultdict(list)
    aurocs: dict[str, list[float]] = defaultdict(list)
    for e in cell.entries:
        kept = (kept_scores(e.run, name, read) or {}).get(e.predictor) or {}
        record = ((e.run.scores.get(name) or {}).get("predictors") or {}).get(e.predictor) or {}
        for score, (ins, outs) in kept.items():
            if score in scores:
                curves[score].append(ood.roc_curve(ins, outs))
                if "auroc" in (record.get(score) or {}):
                    aurocs[score].append(float(record[score]["auroc"]))
    return {score: (*mean_roc(curves[score]), aurocs[score], len(curves[score]))
            for score in ROC_SCORES if curves.get(score)}


def _roc_panel(ax, row: Row, name: str, images: str | None, read: dict, scores) -> None:
    """One row's ROC panel against one OOD set (one version of its images): a curve per predictor and score, the
    diagonal, the legend beneath."""
    ax.plot([0, 1], [0, 1], color="grey", lw=0.9, ls=(0, (1, 2)), label="chance (AUROC 0.5)")
    columns = panel_columns(row, name, images)
    seeds, shade = 1, style.shades()
    for column, color in zip(columns, _colours(columns)):
        cell = row.cells[column]
        k = shade(column.base)  # SGD+ts beside SGD: a lighter shade and, not to rest on the shade alone, markers
        marks = {"marker": style.SHADE_MARKERS[k % len(style.SHADE_MARKERS)], "markevery": 0.1, "ms": 4,
                 "mfc": "none"} if k else {}
        for score, (fpr, tpr, aurocs, n) in roc_curves(cell, name, read, scores).items():
            line_style, said = ROC_SCORES[score]
            ax.plot(fpr, tpr, ls=line_style, lw=1.3, color=color, **marks,
                    label=f"{column.label} · {said}: AUROC {mean_pm(aurocs, 3)} (n={n})")
            seeds = max(seeds, n)
    ax.set(xlim=(-0.01, 1.01), ylim=(-0.01, 1.01),
           xlabel="false positive rate\n(in-distribution test images flagged)",
           ylabel="true positive rate\n(OOD images flagged)")
    style.enough_ticks(ax.xaxis)
    style.enough_ticks(ax.yaxis)
    ax.grid(alpha=0.3)
    style.legend_beneath(ax, below=46, title=ROC_LEGEND + (ROC_SEEDS if seeds > 1 else ""),
                         title_fontsize=7)


def ood_set_text(row: Row, name: str, images: str | None = None) -> str:
    """The OOD set as a title shows it: its spec (a folder by its last two parts) and the images on each side; the
    start of their fingerprint where the row's columns were scored on other versions of them (``images``)."""
    record = next(run.scores[name] for run in row.runs() if name in run.scores and
                  (images is None or (run.scores[name].get("data") or {}).get("fingerprint") == images))
    data = record.get("data") or {}
    spec = str(data.get("spec") or name.removeprefix(OOD))
    if spec.startswith("folder:"):
        spec = "folder " + "/".join(Path(spec.removeprefix("folder:").rstrip("/")).parts[-2:])
    counts = (f" ({data['in_distribution']} test vs {data['out_of_distribution']} OOD images)"
              if "in_distribution" in data and "out_of_distribution" in data else "")
    return f"OOD: {spec}{counts}{images_label(images)}"


def roc_panels(table: Table, read: dict) -> list[tuple[Row, str, str | None]]:
    """``(row, OOD set, its images)`` of every panel ``ood_roc.png`` draws: those with per-image scores of at least
    one run, one per version of the set's images the row's columns were scored on (:func:`image_versions`)."""
    return [(row, name, images) for row in table.rows for name in ood_names(row) for images in image_versions(row, name)
            if any(kept_scores(e.run, name, read) for c in panel_columns(row, name, images)
                   for e in row.cells[c].entries if name in e.run.scores)]


def plot_ood_roc(table: Table, path: Path, scores=DEFAULT_ROC_SCORES) -> bool:
    """ROC curves per row and OOD set (module doc), a curve per predictor and each of ``scores`` it has (default
    :data:`DEFAULT_ROC_SCORES`); False (nothing drawn) when no run kept per-image OOD scores. A row's OOD sets side
    by side, so that a line of the figure is a row where they fit."""
    unknown = [s for s in scores if s not in ROC_SCORES]
    if unknown:
        raise ValueError(f"--roc-scores {' '.join(unknown)}: give some of {', '.join(ROC_SCORES)}")
    read: dict = {}
    panels = roc_panels(table, read)
    if not panels:
        return False
    plt = style.pyplot()
    across = max(sum(1 for r, _, _ in panels if r is row) for row, _, _ in panels)
    lines = max(sum(len(roc_curves(row.cells[c], name, read, scores)) for c in panel_columns(row, name, images))
                for row, name, images in panels)
    fig, axes = style.panels(plt, len(panels), height=style.PANEL[0] + LEGEND_LINE * (lines + 3),
                             across=min(across, style.ACROSS))  # near square axes, and the legend beneath
    shared, own = style.panel_titles([[*row.title_items, ood_set_text(row, name, images)]
                                      for row, name, images in panels])
    for ax, (row, name, images), text in zip(axes, panels, own):
        _roc_panel(ax, row, name, images, read, scores)
        style.title(ax, text)
    style.suptitle(fig, ", ".join(filter(None, [shared, "OOD detection (OOD images the positives)"])))
    style.finish(plt, fig, path)
    return True


def roc_missing(table: Table) -> list[str]:
    """One line naming the OOD records whose per-image scores are not there (scored before they were kept, or the file
    left behind when the run was copied), so draw no ROC curve, and the command that writes them again; nothing when
    every record has them."""
    read: dict = {}
    missing = sorted({f"{run.label}: {name}" for row in table.rows for run in row.runs() for name in run.scores
                      if name.startswith(OOD) and kept_scores(run, name, read) is None})
    if not missing:
        return []
    shown = "; ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    return [f"no ROC curve for {len(missing)} OOD record(s) without per-image scores (no "
            f"{ood.PER_IMAGE_FILE} beside its metrics.json): {shown}; python -m swalab.results.score <run> --ood <spec> again "
            "keeps them"]
