"""The report's files: ``table.md`` (accuracy, NLL, ECE, Brier, paired differences, every column of a row, the
ensembles of seeds, section 3.5) and the CSVs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

from swalab.evaluate import AT_BOUND, reported_metrics
from swalab.identity import group_hash, identity_hash
from swalab.results.diagnostics import section35_of
from swalab.results.runs import Run
from swalab.results.table import (Table, budget_epochs_of, fmt_cell, markdown_table, mean_pm, mean_std,
                                  of_several_runs, paired_differences, sgd_baseline)

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")


def section35_markdown(table: Table) -> list[str]:
    lines = []
    for row in table.rows:
        kin = [r for r in table.rows if r.shares_with is row]
        for fge_label, block in section35_of(row, kin).items():
            if block["consecutive_l2"]:
                lines.append([row.name, f"{fge_label}: consecutive members", fmt_cell(block["consecutive_l2"], 4),
                              fmt_cell(block["max_agreement"])])
            else:
                lines.append([row.name, f"{fge_label}: consecutive members", "needs 2 members or more",
                              "needs 2 members or more"])
            for swa_label, pair in block["vs"].items():
                lines.append([row.name, f"{swa_label} vs the {fge_label} ensemble", fmt_cell(pair["l2"], 4),
                              fmt_cell(pair["agreement"])])
            for swa_label, b in block["other_budget"].items():
                why = f"not compared: B = {b:.3g} ep, the FGE's {block['budget']:.3g} ep"
                lines.append([row.name, f"{swa_label} vs the {fge_label} ensemble", why, why])
    if not lines:
        return []
    return ["## Section 3.5: SWA against the FGE ensemble", "",
            "Mean L2 distance of the test class probabilities and label agreement (%), mean ± std over seeds. For "
            "consecutive FGE members: the mean over pairs of the L2 distance and the highest agreement of any pair. "
            "The paper (PreResNet-164, CIFAR-100): consecutive members 0.126 and at most 87.33%; SWA vs the FGE "
            "ensemble 0.079 and 95.26%.", "",
            *markdown_table(["row", "pair", "mean L2 distance", "label agreement %"], lines), ""]


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text())


def paper_row(paper: dict, dataset: str, model: str) -> dict[str, str] | None:
    return paper.get("rows", {}).get(f"{dataset}/{model}")


def shown_parent(child: Path, parent: str | None) -> str | None:
    """The run a branched run started from, as a report shows it: relative to the working directory when below it,
    else the part of its path below what it shares with the branched run's (``ema/<settings>/seed0``), and when it is
    not there (the runs were made on another machine or moved) its last five parts after ``.../``: a report never
    names a path of the machine it was made on."""
    if not parent or not Path(parent).is_absolute():
        return parent
    below_cwd = shown(parent)
    if below_cwd != parent:
        return below_cwd
    import os

    if not Path(parent).exists():  # recorded on another machine, or moved since: the parent's own
        return ".../" + "/".join(Path(parent).parts[1:][-5:])  # <dataset>/<model>/<method>/<settings>/seed<N>
    try:
        common = os.path.commonpath([str(Path(parent).resolve()), str(Path(child).resolve())])
    except ValueError:
        return Path(parent).name
    return Path(parent).resolve().relative_to(common).as_posix() or Path(parent).name


def shown(path: str | None) -> str | None:
    """A path as a report shows it: relative to the working directory when below it (a report committed
    from a project names no path of the machine it was made on), else as stored."""
    if not path or not Path(path).is_absolute():
        return path
    try:
        return Path(path).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path


def wall_time_markdown(costs: Sequence[dict]) -> list[str]:
    """The wall time of branched rows (``python -m swalab.results.row``) against the naive runs' estimate."""
    rows = [c for c in costs if not c["naive"]]
    if not rows:
        return []
    lines = [[str(c["seed"]), f"{c['epochs']}", f"{c['seconds'] / 60:.1f}", f"{c['naive_epochs']}",
              f"{c['naive_seconds'] / 60:.1f}", f"{c['naive_seconds'] / c['seconds']:.2f}x"] for c in rows]
    total = [sum(c[k] for c in rows) for k in ("epochs", "seconds", "naive_epochs", "naive_seconds")]
    lines.append(["all", f"{total[0]}", f"{total[1] / 60:.1f}", f"{total[2]}", f"{total[3] / 60:.1f}",
                  f"{total[3] / total[1]:.2f}x"])
    return ["## Wall time of the branched rows", "",
            "Epochs the row's runs trained themselves (a branch: after its branch point) and their seconds in the "
            "runs' histories (training, epoch-end hooks, test passes; start-up and final scoring not counted), "
            "against the naive estimate: every column trained straight through, at the row's own mean time "
            "per epoch.", "",
            *markdown_table(["seed", "epochs trained", "minutes", "naive epochs", "naive minutes (estimate)",
                              "saved"], lines), ""]


def cell_text(row, column, metric: str, digits: int) -> str:
    """One cell of a metric table; an empty one says why, a degenerate one says what it is."""
    cell = row.cells.get(column)
    if cell is None:
        return "not run"
    values = cell.values(metric)
    if not values:
        return "not recorded (runs of an earlier swalab)"
    text = fmt_cell(values, digits)
    members = {e.metrics.get("members") for e in cell.entries if column.method == "fge"}
    if members == {1}:
        text += " · 1 member: one SGD snapshot, not an ensemble"
    at_bound = sum(bool(e.metrics.get("temperature_at_bound")) for e in cell.entries)
    if at_bound:
        text += f" · T at its search bound in {at_bound} of {len(cell.entries)} seeds{AT_BOUND}"
    return text


def at_bound_note(table: Table) -> list[str]:
    """The footnote of the cells marked :data:`AT_BOUND` (:func:`cell_text`), when a table has one."""
    from swalab.calibration import BOUNDS

    if not any(e.metrics.get("temperature_at_bound") for row in table.rows for cell in row.cells.values()
               for e in cell.entries):
        return []
    return [f"{AT_BOUND} T at its search bound: the validation split (dataset.val_size) had no NLL minimum inside the "
            f"temperatures searched ({BOUNDS[0]:g} to {BOUNDS[1]:g}), so the +ts scores of those seeds are no "
            "calibrated fit (a split of a few images, or one the predictor classifies without error). Hold out more "
            "images with dataset.val_size.", ""]


def diff_text(row, column, values) -> str:
    """One cell of the paired table; without an SGD run of the same B it says so."""
    if column not in row.cells:
        return "not run"
    if column.method == "sgd" and column.budget == 1:
        return "(the baseline)"
    if of_several_runs(row.cells[column]):
        return "built from several runs: no seed to pair"
    if sgd_baseline(row, column) is None:
        b = budget_epochs_of(column)
        return f"no SGD run of B = {b:.3g} ep" if b is not None else "nothing trained: no B to pair with SGD"
    return _fmt_diff(values) if values else "no seed in common with SGD"


def ensembles_markdown(ensembles: Sequence) -> list[str]:
    """The ensembles of seeds (``swalab.results.ensembles``): each beside the mean of its seeds, or why it is missing."""
    if not any(e.metrics for e in ensembles):
        return []
    lines = []
    for e in ensembles:
        if e.metrics is None:
            lines.append([e.row.name, e.label, ", ".join(map(str, e.seeds)), f"not formed: {e.why}", *[""] * (len(reported_metrics()) - 1)])
            continue
        lines.append([e.row.name, e.label, ", ".join(map(str, e.seeds)),
                      *(f"{e.metrics[m.name]:.{m.digits}f} ({mean_pm(e.members[m.name], m.digits)})"
                        for m in reported_metrics())])
    return ["## Ensembles of seeds (deep ensembles; SWAG x n is MultiSWAG)", "",
            "Each config's seeds as one ensemble: the mean of their saved test probabilities (predictions.pt, no "
            "forward pass), scored like every predictor; in brackets the mean ± std of the seeds on their own. Only runs "
            "of exactly one config but the seed, scored on the same test labels; +ts columns are not ensembled (their "
            "temperature would have to be fitted on the ensemble's own validation split).", "",
            *markdown_table(["row", "ensemble", "seeds", *(m.heading for m in reported_metrics())], lines), ""]


def every_column_markdown(table: Table, ensembles: Sequence) -> list[str]:
    """Per row, every column on a line of its own (a row with a validation split has twice the columns: each
    predictor and its ``+ts``): accuracy, NLL, ECE, Brier, the fitted temperature, the paired differences in accuracy
    and NLL against the row's SGD, and the row's ensembles of seeds. Only for tables with ``+ts`` columns or
    ensembles of seeds."""
    formed = [e for e in ensembles if e.metrics]
    if not formed and not any(c.scaled for c in table.columns):
        return []
    out = ["## Every column of a row: accuracy, NLL, ECE, Brier", "",
           "Mean ± sample std over seeds (n seeds). T: the temperature fitted on the validation split (mean over "
           "seeds). Δ: the paired difference to the row's SGD run of the same seed and budget B (mean ± std over "
           "seeds). An ensemble of seeds has one value; its Δ is to the mean of the SGD seeds.", ""]
    fitted = any("temperature" in e.metrics for row in table.rows for cell in row.cells.values() for e in cell.entries)
    own_table = {id(row): part for _, part in per_dataset_and_model(table) for row in part.rows}  # its B in headers
    for row in table.rows:
        header = own_table[id(row)].header
        acc_diffs, nll_diffs = paired_differences(row, "acc"), paired_differences(row, "nll")
        lines = []
        for column in sorted(row.cells, key=lambda c: c.order):
            cell = row.cells[column]
            temps = [float(e.metrics["temperature"]) for e in cell.entries if "temperature" in e.metrics]
            lines.append([header(column), str(len(cell.entries)),
                          *(mean_pm(cell.values(m.name), m.digits) for m in reported_metrics()),
                          (f"{sum(temps) / len(temps):.3f}" + (AT_BOUND if any(e.metrics.get("temperature_at_bound")
                                                                               for e in cell.entries) else ""))
                          if temps else "",
                          *(mean_pm(diffs[column], d, sign=True) if diffs.get(column) else diff_text(row, column, [])
                            for diffs, d in ((acc_diffs, 2), (nll_diffs, 4)))])  # an empty Δ says why, as paired
        sgd = row.sgd_cells()
        for e in (e for e in formed if e.row is row):
            base = sgd.get(sgd_baseline(row, e.column)) if sgd_baseline(row, e.column) is not None else None
            why = diff_text(row, e.column, []) if base is None else "–"  # the paired table's reason
            delta = {m: (f"{e.metrics[m] - mean_std(base.values(m))[0]:+.{d}f}" if base and base.values(m) else why)
                     for m, d in (("acc", 2), ("nll", 4))}
            lines.append([e.label, f"{len(e.seeds)} (ensemble)",
                          *(f"{e.metrics[m.name]:.{m.digits}f}" for m in reported_metrics()), "",
                          delta["acc"], delta["nll"]])
        out += [f"### {row.name}", "", *markdown_table(["column", "n", *(m.heading for m in reported_metrics()), "T",
                                                         "Δ accuracy", "Δ NLL"], lines), ""]
    if not fitted:
        out += ["T is blank in every row: none of these runs held out a validation split (dataset.val_size), so no "
                "temperature was fitted.", ""]
    return out


def metric_markdown(table: Table, paper: dict | None, level: str = "##") -> tuple[list[str], bool]:
    """The metric tables (accuracy, NLL, ECE, Brier: one row per config, one column per method and budget) and the
    paired differences against SGD, under ``level`` headings; and whether a paper row was shown."""
    columns = table.columns
    header = ["row", *(table.header(c) for c in columns)]
    out: list[str] = []
    shown_paper = False  # whether a paper row was shown: only then is its source said
    for metric, title, digits in ((m.name, m.title, m.digits) for m in reported_metrics()):
        lines = []
        for row in table.rows:
            lines.append([row.name, *(cell_text(row, c, metric, digits) for c in columns)])
            published = paper_row(paper, row.dataset, row.model) if paper and metric == "acc" and not row.label else None
            if published is not None:
                lines.append([f"{row.dataset} / {row.model} (paper)", *(published.get(c.paper, "–") for c in columns)])
                shown_paper = True
        out += [f"{level} {title}", "", *markdown_table(header, lines), ""]
    out += at_bound_note(table)
    diffs = [(row, paired_differences(row)) for row in table.rows]
    diff_columns = sorted({c for row in table.rows for c in row.cells  # +ts keeps the accuracy of its predictor
                           if not (c.method == "sgd" and c.budget == 1) and not c.scaled}, key=lambda c: c.order)
    if diff_columns and any(d or row.sgd_cells() for row, d in diffs):  # SGD ran: each missing pair says why
        lines = [[row.name, *(diff_text(row, c, d.get(c)) for c in diff_columns)] for row, d in diffs]
        example = next(((c, sgd_baseline(row, c)) for row, d in diffs for c in diff_columns if c in d), None)
        pair = f" ({example[0].label} − {example[1].label})" if example else ""
        out += [f"{level} Paired differences against SGD (accuracy points, per seed)", "",
                f"Each seed's accuracy minus the SGD run of the same seed, row and budget B{pair}; mean ± sample std "
                "over the seeds both hold. A column is paired only with an SGD run of exactly its B; a row of a method's own "
                "other settings (SWA's pre-schedule, its lr) with the SGD of the row it shares every other setting with.",
                "",
                *markdown_table(["row", *(f"{table.header(c)} − SGD" for c in diff_columns)], lines), ""]
    return out, shown_paper


def per_dataset_and_model(table: Table) -> list[tuple[str, Table]]:
    """``table`` cut into one table per data set and model (``cifar10 / preresnet20``), in the order of their first
    rows, each with only the columns its own rows fill: a report over several configs is then a few dense tables
    instead of one wide table of mostly empty cells. A row keeps the row it shares its SGD with (same data set and
    model)."""
    parts: dict[str, list] = {}
    for row in table.rows:
        parts.setdefault(f"{row.dataset} / {row.model}", []).append(row)
    return [(name, Table(rows, [])) for name, rows in parts.items()]


def to_markdown(table: Table, paper: dict | None = None, costs: Sequence[dict] = (), ensembles: Sequence = ()) -> str:
    """``table.md``: the metric tables and the paired differences (one section per data set and model when the runs
    hold several), every column of a row, the ensembles of seeds, section 3.5, the rows' wall time, the notes."""
    parts = per_dataset_and_model(table)
    out: list[str] = []
    shown_paper = False
    if len(parts) == 1:
        out, shown_paper = metric_markdown(table, paper)
    else:
        for name, part in parts:
            lines, shown = metric_markdown(part, paper, level="###")
            out += [f"## {name}", "", *lines]
            shown_paper = shown_paper or shown
    out += every_column_markdown(table, ensembles)
    out += ensembles_markdown(ensembles)
    out += section35_markdown(table)
    out += wall_time_markdown(costs)
    out.append("Mean ± sample std over seeds; n = number of seeds (finished runs, each config and seed once). "
               "Columns: method, budget B, and the epochs trained. \"not run\": no finished run of that column in "
               "that row. A method run only with settings of its own stands in its row, the row's name saying which "
               "(\"SWA: model.swa.pre_schedule=base\"); a second config of one method has a row of its own.")
    if shown_paper:
        out.append(f"Paper rows: {paper.get('source', 'Izmailov et al. 2018')}.")
    elif paper:
        pairs = sorted({f"{row.dataset} / {row.model}" for row in table.rows
                        if paper_row(paper, row.dataset, row.model) is None})
        out.append(f"--paper: the paper has no row of {', '.join(pairs)} (its Tables 1 and 2: CIFAR-10, CIFAR-100 "
                   "and ImageNet models), so none is shown." if pairs else
                   "--paper: the paper's rows are of its own settings, and every row here has settings of its own, so "
                   "none is shown.")
    lineage = []
    for row in table.rows:  # one line per branched run, naming every column it fills (a SWAG run fills SWA's too)
        filled: dict = {}
        for c in sorted(row.cells, key=lambda c: c.order):
            for e in row.cells[c].entries:
                branched = (e.run.lineage or {}).get("kind") == "branch"  # swalab.branching's record; an
                if branched and not c.scaled:                               # init_from's weights are no branch
                    filled.setdefault(str(e.run.path), (e.run, []))[1].append(c.label)
        lineage += [f"- {row.name} · {', '.join(labels)}, seed {run.seed}: branched from "  # row · column, as elsewhere
                    f"{shown_parent(run.path, run.lineage.get('parent'))} at epoch {run.lineage.get('epoch')}"
                    for run, labels in sorted(filled.values(), key=lambda rl: (rl[1][0], str(rl[0].seed)))]
    if lineage:
        out += ["", "Branched runs (each equals the run trained straight through, docs/branching.md):", *lineage]
    return "\n".join(out) + "\n"


def _fmt_diff(values: Sequence[float] | None) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    values_text = ", ".join(f"{v:+.2f}" for v in values)
    return f"{mean:+.2f} ± {std:.2f} ({values_text})" if std is not None else f"{mean:+.2f} ({values_text})"


def write_csv(table: Table, path: Path, ensembles: Sequence = ()) -> None:
    """One line per (row, column, metric), and per formed ensemble of seeds (``ensemble`` says ``seeds``; its one
    value in ``mean``, its seeds in ``seeds``)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "dataset", "model", "setting", "column", "method", "budget", "epochs", "metric",
                         "mean", "std", "n", "values", "seeds", "group", "ensemble"])
        for row in table.rows:
            for column in table.columns:
                cell = row.cells.get(column)
                if cell is None:
                    continue
                for metric in (m.name for m in reported_metrics()):
                    values = cell.values(metric)
                    if not values:
                        continue
                    mean, std = mean_std(values)
                    writer.writerow([row.name, row.dataset, row.model, row.setting_of(column), column.label,
                                     column.method,
                                     f"{column.budget:g}", column.epochs, metric, f"{mean:.6f}",
                                     "" if std is None else f"{std:.6f}", len(values),
                                     " ".join(f"{v:.6f}" for v in values), " ".join(map(str, cell.seeds)),
                                     cell.entries[0].cell[0], ""])
        for e in ensembles:
            if e.metrics is None:
                continue
            cell = e.row.cells[e.column]
            for metric in (m.name for m in reported_metrics()):
                writer.writerow([e.row.name, e.row.dataset, e.row.model, e.row.setting_of(e.column), e.label,
                                 e.column.method,
                                 f"{e.column.budget:g}", e.column.epochs, metric, f"{e.metrics[metric]:.6f}", "",
                                 len(e.seeds), f"{e.metrics[metric]:.6f}", " ".join(map(str, e.seeds)),
                                 cell.entries[0].cell[0], "seeds"])


def shown_path(run: Path, roots: Sequence[str | Path]) -> str:
    """``<root name>/<path below it>``: readable wherever the CSV ends up."""
    for root in map(Path, roots):
        try:
            return str(Path(root.resolve().name) / run.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(run)


def write_runs_csv(runs: Sequence[Run], path: Path, roots: Sequence[str | Path] = ()) -> None:
    predictors = sorted({name for r in runs for name, m in r.metrics.items() if isinstance(m, dict) and "acc" in m})
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "status", "dataset", "model", "method", "budget", "epochs", "seed", "group",
                         *predictors, "error"])
        for r in runs:
            accs = [f"{r.metrics[p]['acc']:.4f}" if isinstance(r.metrics.get(p), dict) and "acc" in r.metrics[p] else ""
                    for p in predictors]
            writer.writerow([shown_path(r.path, roots), r.status, r.dataset_name, r.model_name, r.method,
                             f"{float(r.get('method.budget', 1.0) or 0):g}", r.get("trainer.epochs"), r.seed,
                             group_hash(r.identity), *accs, (r.error or "").splitlines()[0] if r.error else ""])


def table_runs(table: Table) -> dict[Run, str]:
    """``{run: label}`` of every run the table counts, a run found twice (in two folders) once, as ``build_table``
    counts it, each labelled by its row, its own column and its seed (``digits / preresnet20 · SWA 1.5B (6 ep) ·
    seed 0``): two configs of one method are never two rows of one name."""
    out: dict[Run, str] = {}
    seen: set[str] = set()
    columns = [(row, column) for row in table.rows
               for column in sorted(row.cells, key=lambda c: (c.posthoc, c.scaled, c.order))]
    for own in (True, False):  # its own predictor's column first (swa of a SWA run), else any of its columns
        for row, column in columns:
            for entry in row.cells[column].entries:
                run = entry.run
                if (not own or entry.predictor == run.method) and identity_hash(run.identity) not in seen:
                    seen.add(identity_hash(run.identity))
                    out[run] = f"{row.name} · {table.header(column)} · seed {run.seed}"
    return out


def other_data_markdown(table: Table) -> list[str]:
    """The runs of the table scored again on other data (``python -m swalab.results.score``, ``<run>/scores/*``): one
    table of the test sets (corrupted ones included) and one of the OOD sets; nothing when no run has been."""
    tested, detected = [], []
    for run, label in table_runs(table).items():  # in the table's order: row, column, seed
        for name, record in run.scores.items():
            for predictor, m in record["predictors"].items():
                if "acc" in m:
                    tested.append([label, name, predictor, f"{m['acc']:.2f}", f"{m['nll']:.4f}", f"{m['ece']:.4f}",
                                   f"{m['ece_mass20']:.4f}" if "ece_mass20" in m else "–", f"{m['brier']:.4f}"])
                else:
                    detected += [[label, name, predictor, score, f"{d['auroc']:.4f}", f"{d['aupr']:.4f}",
                                  f"{d['fpr95']:.4f}"] for score, d in m.items()]
    out = []
    if tested:
        out += ["## Scored on other data (python -m swalab.results.score)", "",
                "Each run's predictors on other test sets (cifar10c-<corruption>-<severity>: its test split corrupted as "
                "CIFAR-10-C); +ts at the run's own temperature.", "",
                *markdown_table(["run", "data", "predictor", "accuracy %", "NLL", "ECE (15 equal-width bins)",
                                  "ECE (20 equal-mass bins)", "Brier"], tested), ""]
    if detected:
        out += ["## Out-of-distribution detection (python -m swalab.results.score --ood)", "",
                "The run's test split against the OOD set (the positives); fpr95: in-distribution images flagged at 95% "
                "OOD recall.", "",
                *markdown_table(["run", "OOD set", "predictor", "score", "AUROC", "AUPR", "FPR95"], detected), ""]
    return out
