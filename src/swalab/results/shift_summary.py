"""The report's tables of runs scored under shift, summarised per cell (one config, its seeds): what a reader compares.

When and why: ``python -m swalab.results.score`` writes one record per run and test set (75 corrupted sets for
``cifar10c:all``), and the report's per-run tables list every one of them; the question a reader brings (does SWA keep
its gain under shift, does SWAG or MultiSWAG beat temperature scaling and Laplace when the data move) is answered by
the summary: per row of the report's table and per column (predictor), at each corruption severity the mean over the
corruptions scored there, then mean ± std over the cell's seeds, as Ovadia et al. (2019) summarise theirs.

* **Under corruption**: every reported metric (accuracy, NLL, ECE, Brier: ``swalab.evaluate.METRICS``) at "clean" (the uncorrupted test set) and at each
  severity 1 to 5, over the corruptions *every* cell of the table (every seed of every column) was scored on at that
  severity, named under the table: two columns are never averaged over different corruptions.
* **Ensembles of seeds under corruption**: a cell's seeds as one ensemble on each corrupted set (the mean of their
  probabilities in ``scores/<set>/predictions.pt``, as ``swalab.results.ensembles`` forms it on the clean set: SGD x3
  a deep ensemble, SWAG x3 MultiSWAG), then the mean over corruptions per severity; ``+ts`` columns are not ensembled.
* **Out-of-distribution detection**: AUROC of the maximum-softmax-probability score per OOD set, mean ± std over
  seeds."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import torch

from swalab.evaluate import ensemble_log_mean, metrics_from_log_probs, reported_metrics
from swalab.results.ensembles import saved_log_probs
from swalab.results.shift_plots import (CORRUPTED, OOD, SEVERITIES, clean_metrics, common_sets, corrupted_records,
                                        image_versions, images_label, images_of, other_images, shared_sets)
from swalab.results.table import Cell, Column, Table, markdown_table, mean_pm
from swalab.rundir import RunDir


def per_seed_severity(cell: Cell, metric: str, sets: Sequence[tuple[str, int]] | None = None) -> dict[int, list[float]]:
    """``{severity: [one value per seed]}``, each the seed's mean over ``sets`` (default: those every seed of the cell
    was scored on) at that severity, and at 0 the clean test set's."""
    sets = shared_sets(cell) if sets is None else sets
    out: dict[int, list[float]] = defaultdict(list)
    for entry in cell.entries:
        records = corrupted_records(entry.run)
        for severity in SEVERITIES:
            values = [records[key][entry.predictor][metric] for key in sets if key[1] == severity]
            if values:
                out[severity].append(statistics.fmean(float(v) for v in values))
        clean = clean_metrics(entry)
        if sets and metric in clean:
            out[0].append(float(clean[metric]))
    return dict(out)


def ensemble_severity(cell: Cell, sets: Sequence[tuple[str, int]] | None = None) -> dict[int, dict[str, float]] | str:
    """The ensemble of the cell's seeds on each of ``sets`` (default: every set all its seeds were scored on), each
    metric averaged over corruptions per severity (``{severity: {metric: value}}``, module doc), or why there is none.
    Each set's predictions are read and ensembled once, for every metric."""
    if len(cell.entries) < 2:
        return "one seed"
    per: dict[int, list[dict[str, float]]] = defaultdict(list)
    files: dict = {}
    for corruption, severity in (shared_sets(cell) if sets is None else sets):
        folder = f"{CORRUPTED}{corruption}-{severity}"
        members, labels = [], None
        for entry in cell.entries:
            log_probs, own, why = saved_log_probs(Path(entry.run.path) / RunDir.SCORES / folder, entry.predictor, files)
            if why is not None:
                return f"seed {entry.run.seed}: {why}"
            if labels is not None and not torch.equal(own, labels):
                return f"seed {entry.run.seed} was scored on other labels of {folder}"
            labels = own
            members.append(log_probs)
        per[severity].append(metrics_from_log_probs(ensemble_log_mean(members), labels))
    if not per:
        return "no corrupted set scored by every seed"
    return {severity: {metric: statistics.fmean(float(m[metric]) for m in scored) for metric, _, _ in _metrics()}
            for severity, scored in sorted(per.items())}


def _metrics() -> list[tuple[str, str, int]]:
    """``(key, heading, digits)`` of every metric a report shows (``swalab.evaluate.METRICS``)."""
    return [(m.name, m.heading, m.digits) for m in reported_metrics()]


def _columns(table: Table):
    for row in table.rows:
        for column in sorted(row.cells, key=lambda c: c.order):
            yield row, column, row.cells[column]


def _name(row, column: Column) -> str:
    return f"{row.name} · {column.label}" if row.name else column.label


def corruption_markdown(table: Table) -> list[str]:
    """The summary tables under corruption, one per metric, and the ensembles of seeds (module doc)."""
    scored = [(row, column, cell) for row, column, cell in _columns(table) if shared_sets(cell)]
    if not scored:
        return []
    common = common_sets([cell for _, _, cell in scored])
    out = ["## Under corruption: mean over corruptions per severity (python -m swalab.results.score)", "",
           "Each seed's mean over the corruptions at a severity, then mean ± std over the seeds; clean: the uncorrupted "
           "test set. Every cell at a severity is averaged over the same corruptions, those every seed of every cell "
           "below was scored on:", "", *_coverage(common, scored), ""]
    out += _severity_tables(scored, common) + _ensemble_tables(scored, common)
    wider = [(row, column, cell) for row, column, cell in scored if set(shared_sets(cell)) > set(common)]
    wide = common_sets([cell for _, _, cell in wider]) if len(wider) > 1 else []
    if len(wide) > len(common):  # some columns were scored on more: the same summary over those, for them alone
        left_out = [_name(row, column) for row, column, cell in scored if (row, column, cell) not in wider]
        out += ["## Under corruption, over more corruptions: the columns scored on them", "",
                f"The same summary over the corruptions every seed of these {len(wider)} cells was scored on; "
                f"{len(left_out)} other cells were not ({', '.join(left_out)}) and stand in the table above only:",
                "", *_coverage(wide, wider), "", *_severity_tables(wider, wide), *_ensemble_tables(wider, wide)]
    return out


def _ensemble_tables(scored, sets: Sequence[tuple[str, int]]) -> list[str]:
    """The seeds of each cell as one ensemble on each of ``sets``, per severity and metric (:func:`ensemble_severity`),
    under the summary over the same ``sets``; and why a cell of several seeds has none."""
    lines, why_not = [], []
    for row, column, cell in scored:
        if column.scaled:
            continue
        found = ensemble_severity(cell, sets)
        if isinstance(found, str):
            if len(cell.entries) > 1:
                why_not.append(f"- {_name(row, column)}: {found}")
            continue
        for metric, title, digits in _metrics():
            lines.append([f"{_name(row, column)} x{len(cell.entries)}", title,
                          *[f"{found[s][metric]:.{digits}f}" if s in found else "–" for s in SEVERITIES]])
    out = []
    if lines:
        out += ["### Ensembles of seeds under corruption (SGD xN: a deep ensemble; SWAG xN: MultiSWAG)", "",
                "The mean of the seeds' probabilities on each corrupted set, scored, then the mean over the same "
                "corruptions as the summary above.", "",
                *markdown_table(["ensemble", "metric", *[f"severity {s}" for s in SEVERITIES]], lines), ""]
    if why_not:
        out += ["Not ensembled under corruption:", *why_not, ""]
    return out


def _severity_tables(scored, sets: Sequence[tuple[str, int]]) -> list[str]:
    """One table per metric: each cell's mean over ``sets`` per severity, mean ± std over its seeds, and clean."""
    header = ["row · column", "seeds", "clean", *[f"severity {s}" for s in SEVERITIES]]
    out = []
    for metric, title, digits in _metrics():
        lines = []
        for row, column, cell in scored:
            values = per_seed_severity(cell, metric, sets)
            lines.append([_name(row, column), str(len(cell.entries)),
                          *[mean_pm(values.get(s), digits) for s in (0, *SEVERITIES)]])
        out += [f"### {title}", "", *markdown_table(header, lines), ""]
    return out


def _coverage(common: Sequence[tuple[str, int]], scored) -> list[str]:
    """The corruptions each severity's column averages over, and what cells were scored on beyond them (left out)."""
    lines = []
    for severity in SEVERITIES:
        names = [c for c, s in common if s == severity]
        lines.append(f"- severity {severity}: " + (f"{len(names)} ({', '.join(names)})" if names else
                                                   "none scored by every cell (–)"))
    beyond = sorted({f"{c}-{s}" for _, _, cell in scored for c, s in shared_sets(cell)} - {f"{c}-{s}" for c, s in common})
    if beyond:
        lines.append(f"- left out, not scored by every cell: {', '.join(beyond)}")
    return lines


def version_of(row, cell: Cell, name: str) -> str:
    """``, images <8 hex>`` where the row's columns were scored on other versions of the set ``name`` (its folder
    changed between their score commands: ``shift_plots.image_versions``), so that no two lines of one set name hold
    other images; else nothing."""
    if len(image_versions(row, name)) < 2:
        return ""
    return images_label(next(iter(images_of(cell, name)), None)) or ", images not recorded"


def ood_markdown(table: Table) -> list[str]:
    """AUROC of the maximum softmax probability per OOD set, mean ± std over a cell's seeds."""
    lines, apart = [], []
    for row, column, cell in _columns(table):
        per_set: dict[str, list[float]] = defaultdict(list)
        for entry in cell.entries:
            for name, record in entry.run.scores.items():
                found = (record.get("predictors") or {}).get(entry.predictor) or {}
                if name.startswith(OOD) and "msp" in found:
                    per_set[name[len(OOD):]].append(float(found["msp"]["auroc"]))
        for name, values in sorted(per_set.items()):
            if len(values) != len(cell.entries):
                continue
            if other_images(cell, OOD + name):  # a folder changed between two score commands: other sets, one name
                apart.append(f"- {_name(row, column)}: {name}: its seeds were scored on other images (the folder "
                             "changed between the score commands): not averaged; score every seed again with the same "
                             "--ood")
                continue
            lines.append([_name(row, column), name + version_of(row, cell, OOD + name), str(len(values)),
                          mean_pm(values, 4)])
    if not lines and not apart:
        return []
    return ["## Out-of-distribution detection, per cell: AUROC of 1 - max softmax probability", "",
            "Mean ± std over the seeds of each cell (a cell counts only where every seed was scored on the set, and on "
            "the same images).", "", *markdown_table(["row · column", "OOD set", "seeds", "AUROC (msp)"], lines), "",
            *([*apart, ""] if apart else [])]

