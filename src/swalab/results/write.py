"""The report's files: ``table.md`` (accuracy, NLL, ECE, paired differences, section 3.5) and the CSVs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

from swalab.identity import group_hash
from swalab.results.diagnostics import section35_of
from swalab.results.runs import Run
from swalab.results.table import (METRICS, Table, budget_epochs_of, fmt_cell, mean_std, paired_differences,
                                  sgd_baseline)

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
            *_markdown_table(["row", "pair", "mean L2 distance", "label agreement %"], lines), ""]


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text())


def paper_row(paper: dict, dataset: str, model: str) -> dict[str, str] | None:
    return paper.get("rows", {}).get(f"{dataset}/{model}")


def _markdown_table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(line) + " |" for line in lines)]


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
            *_markdown_table(["seed", "epochs trained", "minutes", "naive epochs", "naive minutes (estimate)",
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
    return text


def diff_text(row, column, values) -> str:
    """One cell of the paired table; without an SGD run of the same B it says so."""
    if column not in row.cells:
        return "not run"
    if column.method == "sgd" and column.budget == 1:
        return "(the baseline)"
    if sgd_baseline(row, column) is None:
        b = budget_epochs_of(column)
        return f"no SGD run of B = {b:.3g} ep" if b is not None else "no SGD run of its B"
    return _fmt_diff(values) if values else "no seed in common with SGD"


def to_markdown(table: Table, paper: dict | None = None, costs: Sequence[dict] = ()) -> str:
    columns = table.columns
    header = ["row", *(c.label for c in columns)]
    out: list[str] = []
    for metric, title in METRICS:
        digits = 2 if metric == "acc" else 4
        lines = []
        for row in table.rows:
            lines.append([row.name, *(cell_text(row, c, metric, digits) for c in columns)])
            published = paper_row(paper, row.dataset, row.model) if paper and metric == "acc" and not row.label else None
            if published is not None:
                lines.append([f"{row.name} (paper)", *(published.get(c.paper, "–") for c in columns)])
        out += [f"## {title}", "", *_markdown_table(header, lines), ""]
    diffs = [(row, paired_differences(row)) for row in table.rows]
    diff_columns = sorted({c for row in table.rows for c in row.cells if not (c.method == "sgd" and c.budget == 1)},
                          key=lambda c: c.order)
    if diff_columns and any(d or row.sgd_cells() for row, d in diffs):  # SGD ran: each missing pair says why
        lines = [[row.name, *(diff_text(row, c, d.get(c)) for c in diff_columns)] for row, d in diffs]
        example = next(((c, sgd_baseline(row, c)) for row, d in diffs for c in diff_columns if c in d), None)
        pair = f" ({example[0].label} − {example[1].label})" if example else ""
        out += ["## Paired differences against SGD (accuracy points, per seed)", "",
                f"Each seed's accuracy minus the SGD run of the same seed, row and budget B{pair}; mean ± sample std "
                "over the seeds both hold. A column is paired only with an SGD run of exactly its B; a row of a method's own "
                "other settings (SWA's pre-schedule, its lr) with the SGD of the row it shares every other setting with.",
                "",
                *_markdown_table(["row", *(f"{c.label} − SGD" for c in diff_columns)], lines), ""]
    out += section35_markdown(table)
    out += wall_time_markdown(costs)
    out.append("Mean ± sample std over seeds; n = number of seeds (finished runs, each config and seed once). "
               "Columns: method, budget B, and the epochs trained. \"not run\": no finished run of that column in "
               "that row (a run of other settings has a row of its own).")
    if paper:
        out.append(f"Paper rows: {paper.get('source', 'Izmailov et al. 2018')}.")
    lineage = [f"- {row.name}, {c.label}, seed {e.run.seed}: branched from {shown(e.run.lineage.get('parent'))} at epoch "
               f"{e.run.lineage.get('epoch')}" for row in table.rows for c, cell in row.cells.items()
               for e in cell.entries if e.run.lineage]
    if lineage:
        out += ["", "Branched runs (each equals the run trained straight through, docs/branching.md):", *lineage]
    return "\n".join(out) + "\n"


def _fmt_diff(values: Sequence[float] | None) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    values_text = ", ".join(f"{v:+.2f}" for v in values)
    return f"{mean:+.2f} ± {std:.2f} ({values_text})" if std is not None else f"{mean:+.2f} ({values_text})"


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "dataset", "model", "setting", "column", "method", "budget", "epochs", "metric",
                         "mean", "std", "n", "values", "seeds", "group"])
        for row in table.rows:
            for column in table.columns:
                cell = row.cells.get(column)
                if cell is None:
                    continue
                for metric, _ in METRICS:
                    values = cell.values(metric)
                    if not values:
                        continue
                    mean, std = mean_std(values)
                    writer.writerow([row.name, row.dataset, row.model, row.label, column.label, column.method,
                                     f"{column.budget:g}", column.epochs, metric, f"{mean:.6f}",
                                     "" if std is None else f"{std:.6f}", len(values),
                                     " ".join(f"{v:.6f}" for v in values), " ".join(map(str, cell.seeds)),
                                     cell.entries[0].cell[0]])


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
