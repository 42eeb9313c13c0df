"""Paper-style tables and plots from finished runs: ``python -m swalab.report <dir> [<dir> ...]``.

Use it after a grid (``python run.py -m ...``) or on any tree of run directories. It reads only the
files each run wrote (``config.yaml``, ``status.json``, ``metrics.json``, ``history.jsonl``,
``reliability.json``, ``lineage.json``), never the weights, so it takes seconds on any machine.

Writes to ``--out`` (default ``report/``):

    table.md / table.csv   rows = dataset + model; columns = SGD, FGE, SWA at each budget, EMA;
                           cells = test accuracy mean +- std over seeds (n = number of seeds)
    runs.csv               one line per run: where it is, its status and every predictor's accuracy
    test_error.png         test error against epoch per method (the live model; SWA's average too
                           when the run scored it during training)
    fge_curve.png          FGE ensemble accuracy against the number of members, SWA as a line
    reliability.png        reliability diagrams (accuracy against confidence) per predictor

A SWA run contributes to the column of its own budget (``method.budget``) and, through its
``swa@<b>`` predictors (``method.eval_at_budgets``), to the columns of earlier budget marks. Runs
that failed or did not finish are listed, not dropped; ``--paper`` prints the paper's Table 1/2
numbers beside ours; ``--wandb`` also pushes the table and plots to W&B (offline unless
``--wandb-mode online``).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import yaml

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")
METHOD_ORDER = {"sgd": 0, "fge": 1, "swa": 2, "ema": 3}


@dataclass
class Run:
    """What one run directory holds (files that are missing stay empty)."""

    path: Path
    status: str
    error: str | None
    dataset: str
    model: str
    method: str
    budget: float
    seed: int | None
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    reliability: dict = field(default_factory=dict)
    lineage: dict | None = None

    @property
    def finished(self) -> bool:
        return self.status == "complete" and bool(self.metrics)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_history(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a kill
    return rows


def run_dirs(roots: Iterable[str | Path]) -> list[Path]:
    """Every run directory below ``roots``: a folder with ``config.yaml``, ``status.json`` or a Hydra
    job record (``.hydra/``, a job that failed before it wrote anything else)."""
    found: set[Path] = set()
    for root in map(Path, roots):
        for marker in ("config.yaml", "status.json", ".hydra"):
            for hit in root.rglob(marker):
                if ".hydra" in hit.parent.parts or "wandb" in hit.parent.parts:
                    continue
                found.add(hit.parent)
    return sorted(found)


def read_run(path: Path) -> Run:
    cfg = {}
    for candidate in (path / "config.yaml", path / ".hydra" / "config.yaml"):
        if candidate.exists():
            try:
                cfg = yaml.safe_load(candidate.read_text()) or {}
            except yaml.YAMLError:
                cfg = {}
            break
    status = _read_json(path / "status.json") or {}
    state = status.get("status") or ("complete" if (path / "metrics.json").exists() else "failed before training")
    method = cfg.get("method") or {}
    return Run(path=path, status=state, error=status.get("error"),
               dataset=str((cfg.get("dataset") or {}).get("name", "?")), model=str((cfg.get("model") or {}).get("name", "?")),
               method=str(method.get("name", "?")), budget=float(method.get("budget", 1.0) or 1.0),
               seed=cfg.get("seed"), metrics=_read_json(path / "metrics.json") or {},
               history=_read_history(path / "history.jsonl"),
               reliability=_read_json(path / "reliability.json") or {},
               lineage=_read_json(path / "lineage.json"))


def fmt_budget(b: float) -> str:
    return f"{b:g}B"


def column_of(method: str, budget: float) -> str:
    """The table column a (method, budget) result belongs to, named as in the paper."""
    if method == "sgd":
        return "SGD" if budget == 1 else f"SGD {fmt_budget(budget)}"
    if method == "swa":
        return f"SWA {fmt_budget(budget)}"
    return f"{method.upper()} ({fmt_budget(budget)})"


def column_key(name: str) -> tuple:
    """Columns in the paper's order: SGD, FGE, SWA by growing budget, EMA."""
    budget = re.search(r"\d+(?:\.\d+)?", name)
    return METHOD_ORDER.get(name.split()[0].lower(), 9), float(budget.group()) if budget else 1.0, name


def results_of(run: Run) -> dict[str, float]:
    """``{column: test accuracy}`` that one finished run contributes."""
    out: dict[str, float] = {}
    main = run.metrics.get(run.method)
    if isinstance(main, dict) and "acc" in main:
        out[column_of(run.method, run.budget)] = float(main["acc"])
    if run.method == "swa":
        for name, m in run.metrics.items():
            if name.startswith("swa@") and isinstance(m, dict) and "acc" in m:
                out.setdefault(column_of("swa", float(name[4:])), float(m["acc"]))
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt_cell(values: Sequence[float]) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f} (n={len(values)})" if std is not None else f"{mean:.2f} (n=1)"


@dataclass
class Table:
    columns: list[str]
    rows: dict[tuple[str, str], dict[str, list[float]]]
    lineage: dict[tuple[str, str], list[str]]


def build_table(runs: Sequence[Run]) -> Table:
    rows: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    lineage: dict[tuple[str, str], list[str]] = defaultdict(list)
    columns: set[str] = set()
    for run in runs:
        if not run.finished:
            continue
        for column, acc in results_of(run).items():
            rows[(run.dataset, run.model)][column].append(acc)
            columns.add(column)
        if run.lineage:
            parent = run.lineage.get("parent") or run.lineage.get("checkpoint")
            lineage[(run.dataset, run.model)].append(
                f"{column_of(run.method, run.budget)} seed {run.seed} from {parent} (epoch {run.lineage.get('epoch')})")
    return Table(sorted(columns, key=column_key), dict(rows), dict(lineage))


def load_paper_tables(path: Path = PAPER_TABLES) -> dict:
    return json.loads(path.read_text())


def paper_row(paper: dict, dataset: str, model: str) -> dict[str, str] | None:
    return paper.get("rows", {}).get(f"{dataset}/{model}")


def to_markdown(table: Table, paper: dict | None = None) -> str:
    header = ["dataset", "model", *table.columns] + (["lineage"] if table.lineage else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes: list[str] = []
    for (dataset, model), cells in sorted(table.rows.items()):
        line = [dataset, model, *(fmt_cell(cells.get(c, [])) for c in table.columns)]
        if table.lineage:
            refs = table.lineage.get((dataset, model), [])
            marks = []
            for ref in refs:
                notes.append(ref)
                marks.append(f"[{len(notes)}]")
            line.append(" ".join(marks) or "–")
        lines.append("| " + " | ".join(line) + " |")
        published = paper_row(paper, dataset, model) if paper else None
        if published is not None:
            line = [dataset, f"{model} (paper)", *(published.get(c, "–") for c in table.columns)]
            lines.append("| " + " | ".join(line + (["–"] if table.lineage else [])) + " |")
    text = "\n".join(lines) + "\n"
    text += "\nTest accuracy (%), mean ± sample std over seeds; n = number of seeds (finished runs).\n"
    if paper:
        text += f"Paper rows: {paper.get('source', 'Izmailov et al. 2018')}.\n"
    for i, note in enumerate(notes, start=1):
        text += f"\n[{i}] {note}"
    return text + ("\n" if notes else "")


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["dataset", "model", "column", "mean", "std", "n", "values"])
        for (dataset, model), cells in sorted(table.rows.items()):
            for column in table.columns:
                values = cells.get(column, [])
                if values:
                    mean, std = mean_std(values)
                    writer.writerow([dataset, model, column, f"{mean:.4f}", "" if std is None else f"{std:.4f}",
                                     len(values), " ".join(f"{v:.4f}" for v in values)])


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
        writer.writerow(["path", "status", "dataset", "model", "method", "budget", "seed", *predictors, "error"])
        for r in runs:
            accs = [f"{r.metrics[p]['acc']:.4f}" if isinstance(r.metrics.get(p), dict) and "acc" in r.metrics[p] else ""
                    for p in predictors]
            writer.writerow([shown_path(r.path, roots), r.status, r.dataset, r.model, r.method, f"{r.budget:g}", r.seed, *accs,
                             (r.error or "").splitlines()[0] if r.error else ""])


# -- plots -----------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.usetex"] = False
    import matplotlib.pyplot as plt

    return plt


def _groups(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
    out: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        if r.finished:
            out[(r.dataset, r.model)].append(r)
    return dict(sorted(out.items()))


def _by_column(group: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs of one (dataset, model) keyed by their table column (method and budget)."""
    out: dict[str, list[Run]] = defaultdict(list)
    for r in group:
        out[column_of(r.method, r.budget)].append(r)
    return out


def plot_test_error(runs: Sequence[Run], path: Path) -> bool:
    """Test error (%) against epoch: mean over seeds per (method, budget); SWA's average dashed."""
    groups = _groups(runs)
    series = {k: v for k, v in groups.items() if any("test_acc" in row for r in v for row in r.history)}
    if not series:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4), squeeze=False)
    for ax, ((dataset, model), group) in zip(axes[0], series.items()):
        by_label = _by_column(group)
        for label in sorted(by_label, key=column_key):
            for key, suffix, style in (("test_acc", "", "-"), ("swa_test_acc", " (average)", "--")):
                points: dict[int, list[float]] = defaultdict(list)
                for r in by_label[label]:
                    for row in r.history:
                        if key in row:
                            points[int(row["epoch"])].append(100.0 - float(row[key]))
                if points:
                    epochs = sorted(points)
                    live = " (live model)" if label.startswith("SWA") and key == "test_acc" else ""
                    ax.plot(epochs, [statistics.fmean(points[e]) for e in epochs], style, marker="o", ms=3,
                            label=f"{label}{suffix}{live}")
        ax.set(title=f"{dataset} / {model}", xlabel="epoch", ylabel="test error (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_fge_curve(runs: Sequence[Run], path: Path) -> bool:
    """FGE ensemble accuracy against the number of members; the SWA model's accuracy as a line."""
    groups = {k: v for k, v in _groups(runs).items()
              if any(isinstance(r.metrics.get("fge"), dict) and r.metrics["fge"].get("curve") for r in v)}
    if not groups:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, ((dataset, model), group) in zip(axes[0], groups.items()):
        points: dict[int, list[float]] = defaultdict(list)
        for r in group:
            for row in (r.metrics.get("fge") or {}).get("curve") or []:
                points[int(row["members"])].append(float(row["acc"]))
        ks = sorted(points)
        ax.plot(ks, [statistics.fmean(points[k]) for k in ks], marker="o", label="FGE ensemble")
        swa = defaultdict(list)
        for r in group:
            if r.method == "swa" and isinstance(r.metrics.get("swa"), dict):
                swa[column_of("swa", r.budget)].append(float(r.metrics["swa"]["acc"]))
        for i, (label, values) in enumerate(sorted(swa.items())):
            ax.axhline(statistics.fmean(values), color=f"C{i + 1}", ls="--", label=f"{label} model")
        ax.set(title=f"{dataset} / {model}", xlabel="ensemble members", ylabel="test accuracy (%)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def pooled_bins(runs: Sequence[Run], predictor: str) -> list[dict]:
    """Reliability bins of one predictor summed over runs (counts add, accuracy/confidence weighted)."""
    acc: dict[int, list[float]] = {}
    for r in runs:
        for i, b in enumerate(r.reliability.get(predictor) or []):
            slot = acc.setdefault(i, [b["lo"], b["hi"], 0.0, 0.0, 0.0])
            if b.get("count"):
                slot[2] += b["count"]
                slot[3] += b["count"] * b["acc"]
                slot[4] += b["count"] * b["conf"]
    return [{"lo": lo, "hi": hi, "count": int(n), "acc": a / n if n else None, "conf": c / n if n else None}
            for _, (lo, hi, n, a, c) in sorted(acc.items())]


def plot_reliability(runs: Sequence[Run], path: Path) -> bool:
    """One panel per (dataset, model): accuracy against confidence per method's main predictor."""
    groups = {k: v for k, v in _groups(runs).items() if any(r.reliability for r in v)}
    if not groups:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 5), squeeze=False)
    for ax, ((dataset, model), group) in zip(axes[0], groups.items()):
        by_label = _by_column(group)
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="perfect calibration")
        for label in sorted(by_label, key=column_key):
            bins = [b for b in pooled_bins(by_label[label], by_label[label][0].method) if b["count"]]
            if bins:
                ax.plot([b["conf"] for b in bins], [b["acc"] for b in bins], marker="o", ms=3, label=label)
        ax.set(title=f"{dataset} / {model}", xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# -- the command -------------------------------------------------------------------------------

def problems_of(runs: Sequence[Run]) -> list[str]:
    """Plain-language notes about what the input holds that the table cannot show."""
    notes = []
    unfinished = [r for r in runs if not r.finished]
    for r in unfinished:
        why = f": {r.error.splitlines()[0]}" if r.error else ""
        notes.append(f"{r.status}: {r.path}{why}")
    datasets = sorted({r.dataset for r in runs if r.finished})
    if len(datasets) > 1:
        notes.insert(0, f"the runs mix {len(datasets)} datasets ({', '.join(datasets)}): "
                        "one table row per dataset and model, never averaged across datasets")
    return notes


def push_to_wandb(table: Table, images: dict[str, Path], out: Path, mode: str, project: str) -> None:
    """Log the table (a ``wandb.Table``) and the plots to a ``job_type=report`` W&B run."""
    from swalab.tracking import WandbTracker

    tracker = WandbTracker(project=project, run_dir=out, run_config={"report": str(out)}, mode=mode,
                           job_type="report", tags=["swa-lab", "report"])
    def write():
        import wandb

        rows = [[d, m, *(fmt_cell(cells.get(c, [])) for c in table.columns)] for (d, m), cells in sorted(table.rows.items())]
        tracker.run.log({"table": wandb.Table(columns=["dataset", "model", *table.columns], data=rows)})
    tracker._call("table", write)
    tracker.log_images({name: p for name, p in images.items()})
    tracker.finish()


def report(roots: Sequence[str | Path], out: str | Path, paper: bool = False, wandb_mode: str | None = None,
           wandb_project: str = "swalab") -> dict:
    """Collect runs below ``roots``, write the table, CSVs and plots to ``out``; return what was found."""
    out = Path(out)
    missing = [str(r) for r in roots if not Path(r).exists()]
    if missing:
        raise FileNotFoundError(f"no such directory: {', '.join(missing)}")
    runs = [read_run(p) for p in run_dirs(roots)]
    finished = [r for r in runs if r.finished]
    notes = problems_of(runs)
    out.mkdir(parents=True, exist_ok=True)
    table = build_table(runs)
    written: dict[str, Path] = {}
    if finished:
        (out / "table.md").write_text(to_markdown(table, load_paper_tables() if paper else None)
                                      + ("\n## Not in the table\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
                                         if notes else ""))
        write_csv(table, out / "table.csv")
        written.update({"table.md": out / "table.md", "table.csv": out / "table.csv"})
        for name, plot in (("test_error", plot_test_error), ("fge_curve", plot_fge_curve),
                           ("reliability", plot_reliability)):
            if plot(runs, out / f"{name}.png"):
                written[f"{name}.png"] = out / f"{name}.png"
    if runs:
        write_runs_csv(runs, out / "runs.csv", roots)
        written["runs.csv"] = out / "runs.csv"
    if wandb_mode and finished:
        push_to_wandb(table, {k: v for k, v in written.items() if k.endswith(".png")}, out, wandb_mode, wandb_project)
    return {"runs": runs, "finished": finished, "table": table, "notes": notes, "written": written}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swalab.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="multirun / output directories to walk for run directories")
    parser.add_argument("--out", default="report", help="where the table, CSVs and plots go (default: report/)")
    parser.add_argument("--paper", action="store_true", help="show the paper's numbers (Tables 1 and 2) beside ours")
    parser.add_argument("--wandb", action="store_true", help="also log the table and plots to W&B")
    parser.add_argument("--wandb-mode", default="offline", choices=["online", "offline"], help="W&B mode (offline)")
    parser.add_argument("--wandb-project", default="swalab", help="W&B project")
    args = parser.parse_args(argv)
    try:
        result = report(args.dirs, args.out, paper=args.paper,
                        wandb_mode=args.wandb_mode if args.wandb else None, wandb_project=args.wandb_project)
    except FileNotFoundError as exc:
        print(f"[swalab.report] {exc}", file=sys.stderr)
        return 2
    runs, finished = result["runs"], result["finished"]
    print(f"[swalab.report] {len(runs)} run directories, {len(finished)} finished")
    for note in result["notes"]:
        print(f"[swalab.report] {note}")
    if not finished:
        print(f"[swalab.report] no finished runs (metrics.json with status complete) below {', '.join(args.dirs)}: "
              "no table written", file=sys.stderr)
        return 1
    print((Path(args.out) / "table.md").read_text())
    print(f"[swalab.report] wrote {', '.join(sorted(result['written']))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
