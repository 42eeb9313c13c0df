"""Paper-style tables and plots from finished runs: ``python -m swalab.report <dir> [<dir> ...]``.

Use it after a grid (``python run.py -m ...``) or on any tree of run directories, or on the grid
records in ``outputs/grids/<date_time>/`` (then exactly that grid's runs are read). It reads only the
files each run wrote (``config.yaml``/``identity.json``, ``status.json``, ``metrics.json``,
``history.jsonl``, ``reliability.json``, ``lineage.json``), never the weights, so it takes seconds.

How runs become a table, so that a table never mixes or double-counts runs:

* a **cell** holds the runs of one identity minus the seed (``swalab.identity``): one config, its
  seeds. Each (identity, seed) counts once, however many directories hold it (the others are
  listed as duplicates);
* a **row** holds the cells whose identities differ only in the method (``method.*``, the run's
  length, the schedule's horizon): the SGD, FGE, SWA and EMA of one setting. Runs that differ in
  anything else (a training-set size, a batch size, a data set) are separate rows, labelled with the
  keys that set them apart; two configs of one method in one row (say two SWA learning rates) put
  the second in a row of its own, labelled with the keys that differ;
* a **column** is a method at a budget, with the epochs behind it (``SWA 1.25B (188 ep)``). A SWA
  run contributes to its own column and, through its ``swa@<b>`` predictors
  (``model.swa.score_at_budgets``), to the columns of the earlier budget marks.

Writes to ``--out`` (default ``report/``):

    table.md          accuracy, NLL and ECE tables (mean ± std over seeds, n), paired differences
                      against SGD per seed, the runs not in the table (failed, unfinished, duplicates)
    table.csv         one line per (row, column, metric): mean, std, n, the values and their seeds
    runs.csv          one line per run: where it is, its state, every predictor's accuracy
    test_error.png    test error against epoch per column (the live model; SWA's average dashed)
    fge_curve.png     FGE ensemble accuracy against the number of members, SWA as a line
    reliability.png   reliability diagrams (accuracy against confidence) per column

``--paper`` prints the paper's Table 1/2 numbers beside ours; ``--wandb`` also builds a W&B Report
(``swalab.wandb_report``: numeric Table 1, test error against epoch, the FGE curve with SWA, each panel
linked to its training runs), saved online with ``--wandb-mode online``, else written as a spec
(``wandb_report.json``) with the one command that publishes it later.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import yaml

from swalab.identity import differences, group_hash, identity_hash, identity_of, stored_identity

PAPER_TABLES = Path(__file__).with_name("paper_tables.json")
METHOD_ORDER = {"pretrained": 0, "sgd": 1, "fge": 2, "swa": 3, "ema": 4}
METRICS = (("acc", "Test accuracy (%)"), ("nll", "Test NLL (mean per image)"), ("ece", "Test ECE (15 bins)"))
# What only the method decides: left out of a row's key so that SGD, FGE, SWA and EMA share a row.
METHOD_KEYS = ("method", "trainer.epochs", "schedule.horizon")


@dataclass
class Run:
    """What one run directory holds (files that are missing stay empty)."""

    path: Path
    status: str
    error: str | None
    config: dict
    identity: dict
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    reliability: dict = field(default_factory=dict)
    lineage: dict | None = None

    @property
    def finished(self) -> bool:
        return self.status == "complete" and bool(self.metrics)

    def get(self, key: str, default=None):
        node = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def dataset(self) -> str:
        return str(self.get("dataset.name", "?"))

    @property
    def model(self) -> str:
        return str(self.get("model.name", "?"))

    @property
    def method(self) -> str:
        return str(self.get("method.name", "?"))

    @property
    def seed(self):
        return self.get("seed")


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
    """Every run directory below ``roots`` (a folder with ``config.yaml``, ``status.json`` or
    ``identity.json``); a grid record (``jobs/*.json``) names its runs itself."""
    from swalab.grid import read_jobs

    found: set[Path] = set()
    for root in map(Path, roots):
        for job in read_jobs(root):
            if job.get("run_dir"):
                found.add(Path(job["run_dir"]))
        for marker in ("config.yaml", "status.json", "identity.json"):
            for hit in root.rglob(marker):
                if "wandb" in hit.parent.parts:
                    continue
                found.add(hit.parent)
    return sorted(p for p in found if p.exists())


def read_run(path: Path) -> Run:
    config = {}
    if (path / "config.yaml").exists():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        except yaml.YAMLError:
            config = {}
    status = _read_json(path / "status.json") or {}
    state = status.get("status") or ("complete" if (path / "metrics.json").exists() else "no status")
    return Run(path=path, status=state, error=status.get("error"), config=config,
               identity=stored_identity(path) or identity_of(config), metrics=_read_json(path / "metrics.json") or {},
               history=_read_history(path / "history.jsonl"), reliability=_read_json(path / "reliability.json") or {},
               lineage=_read_json(path / "lineage.json"))


# -- what a run contributes ------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """A method at a budget, with the epochs behind it."""

    method: str
    budget: float
    epochs: int

    @property
    def label(self) -> str:
        return f"{self.method.upper()} {self.budget:g}B ({self.epochs} ep)"

    @property
    def order(self) -> tuple:
        return METHOD_ORDER.get(self.method, 9), self.budget, self.epochs, self.method

    @property
    def paper(self) -> str:
        """The paper's name for the column (Tables 1 and 2)."""
        if self.method in ("sgd", "pretrained"):
            return "SGD"
        if self.method == "fge":
            return f"FGE ({self.budget:g}B)"
        return f"{self.method.upper()} {self.budget:g}B"


@dataclass
class Entry:
    """One predictor of one run, as a table sees it."""

    run: Run
    predictor: str
    column: Column
    metrics: dict

    @property
    def cell(self) -> tuple[str, str]:
        return group_hash(self.run.identity), self.predictor


def entries_of(run: Run) -> list[Entry]:
    """The run's own predictor (``sgd`` of an SGD run, ``swa`` of a SWA run...) and SWA's budget marks."""
    out = []
    epochs = int(run.get("trainer.epochs", 0) or 0)
    budget = float(run.get("method.budget", 1.0) or 0.0)
    for name, m in run.metrics.items():
        if not isinstance(m, dict) or "acc" not in m:
            continue
        if name != run.method and not (run.method == "swa" and name.startswith("swa@")):
            continue  # e.g. the last iterate of a SWA run is not the SGD baseline
        column = Column(run.method, float(m.get("budget", budget)), int(m.get("epoch", epochs)))
        out.append(Entry(run, name, column, m))
    return out


def context_of(run: Run) -> dict:
    """The identity minus the seed and what only the method decides: the key of a table row."""
    return {k: v for k, v in run.identity.items()
            if k != "seed" and not any(k == p or k.startswith(p + ".") for p in METHOD_KEYS)}


# -- the table ---------------------------------------------------------------------------------------

@dataclass
class Cell:
    entries: list[Entry]                     # one per seed

    @property
    def seeds(self) -> list:
        return [e.run.seed for e in self.entries]

    def values(self, metric: str) -> list[float]:
        return [float(e.metrics[metric]) for e in self.entries if metric in e.metrics]

    def by_seed(self, metric: str) -> dict:
        return {e.run.seed: float(e.metrics[metric]) for e in self.entries if metric in e.metrics}


@dataclass
class Row:
    dataset: str
    model: str
    label: str                               # the keys that set this row apart ("" for the only one)
    cells: dict[Column, Cell]

    @property
    def name(self) -> str:
        return f"{self.dataset} / {self.model}" + (f" · {self.label}" if self.label else "")

    def runs(self) -> list[Run]:
        return [e.run for cell in self.cells.values() for e in cell.entries]


@dataclass
class Table:
    rows: list[Row]
    duplicates: list[str]

    @property
    def columns(self) -> list[Column]:
        return sorted({c for row in self.rows for c in row.cells}, key=lambda c: c.order)


def _label(keys: Sequence[str], values: dict) -> str:
    """``key=value`` for each key; a ``_target_`` shows as its class name (``schedule=Cosine``)."""
    parts = []
    for k in keys:
        value = values.get(k, "–")
        if k.endswith("._target_"):
            parts.append(f"{k[:-len('._target_')]}={str(value).rsplit('.', 1)[-1]}")
        else:
            parts.append(f"{k}={value}")
    return ", ".join(parts)


def _first_written(entries: Sequence[Entry]) -> float:
    times = [(e.run.path / "config.yaml").stat().st_mtime for e in entries if (e.run.path / "config.yaml").exists()]
    return min(times, default=0.0)


def build_table(runs: Sequence[Run]) -> Table:
    """Cells by identity minus seed (each seed once), rows by identity minus seed and method (module doc)."""
    duplicates: list[str] = []
    cells: dict[tuple[str, str], dict] = {}
    seen: dict[tuple[str, str], Run] = {}
    for run in sorted((r for r in runs if r.finished), key=lambda r: str(r.path)):
        for entry in entries_of(run):
            once = (identity_hash(run.identity), entry.predictor)
            if once in seen:
                duplicates.append(f"{run.path} repeats {seen[once].path} (same config and seed): counted once")
                continue
            seen[once] = run
            cells.setdefault(entry.cell, {"entries": [], "context": context_of(run), "column": entry.column})
            cells[entry.cell]["entries"].append(entry)
    # rows: one per distinct context; within a row one cell per column, further variants in rows of their own
    contexts: dict[str, dict] = {}
    for key, cell in cells.items():
        ctx_key = json.dumps(cell["context"], sort_keys=True, default=str)
        contexts.setdefault(ctx_key, {"context": cell["context"], "columns": defaultdict(list)})
        contexts[ctx_key]["columns"][cell["column"]].append(key)
    rows: list[Row] = []
    by_pair: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for ctx in contexts.values():
        c = ctx["context"]
        by_pair[(str(c.get("dataset.name", "?")), str(c.get("model.name", "?")))].append(ctx)
    for (dataset, model), group in sorted(by_pair.items()):
        varying = sorted({k for ctx in group for k in set(ctx["context"]) | set(group[0]["context"])
                          if any(ctx["context"].get(k) != group[0]["context"].get(k) for ctx in group)})
        runs_in = lambda g: sum(len(cells[k]["entries"]) for keys in g["columns"].values() for k in keys)  # noqa: E731
        for ctx in sorted(group, key=lambda g: (-runs_in(g), _label(varying, g["context"]))):
            base_label = _label(varying, ctx["context"]) if len(group) > 1 else ""
            main: dict[Column, Cell] = {}
            extra: list[Row] = []
            for column, keys in ctx["columns"].items():  # the variant with most seeds, then the first run, leads
                variants = sorted(keys, key=lambda k: (-len(cells[k]["entries"]), _first_written(cells[k]["entries"]), k))
                main[column] = Cell(cells[variants[0]]["entries"])
                first = cells[variants[0]]["entries"][0].run.identity
                for k in variants[1:]:
                    other = cells[k]["entries"][0].run.identity
                    keys_apart = [d.split(":")[0] for d in differences(other, first) if not d.startswith("seed:")]
                    label = _label(keys_apart, other)
                    extra.append(Row(dataset, model, ", ".join(p for p in (base_label, label) if p),
                                     {column: Cell(cells[k]["entries"])}))
            rows.append(Row(dataset, model, base_label, main))
            rows.extend(sorted(extra, key=lambda r: r.label))
    for row in rows:
        for cell in row.cells.values():
            cell.entries.sort(key=lambda e: (str(e.run.seed), str(e.run.path)))
    return Table(rows, duplicates)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt_cell(values: Sequence[float], digits: int = 2) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f} (n={len(values)})" if std is not None else \
        f"{mean:.{digits}f} (n=1)"


def paired_differences(row: Row, metric: str = "acc") -> dict[Column, list[float]]:
    """Per seed, each column minus the row's SGD column, over the seeds both hold."""
    sgd = next((cell for column, cell in row.cells.items() if column.method == "sgd" and column.budget == 1), None)
    if sgd is None:
        return {}
    base = sgd.by_seed(metric)
    out = {}
    for column, cell in row.cells.items():
        if column.method == "sgd" and column.budget == 1:
            continue
        mine = cell.by_seed(metric)
        shared = [s for s in mine if s in base]
        if shared:
            out[column] = [mine[s] - base[s] for s in sorted(shared, key=str)]
    return out


# -- section 3.5: SWA against the FGE ensemble, from the probabilities the runs saved --------------------

def _load_probs(path: Path) -> dict | None:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None


def section35_of(row: Row) -> dict[str, dict]:
    """Per FGE column of ``row``: the paper's section 3.5 numbers for each seed that has both an FGE run
    (``fge_member_probs.pt``) and SWA runs (``predictions.pt``), scored on the same test labels.

    ``{fge column label: {"consecutive_l2": [...], "max_agreement": [...], "vs": {swa column label:
    {"l2": [...], "agreement": [...]}}}}``, one value per seed.
    """
    from swalab.diagnostics import section35
    from swalab.methods.fge import MEMBER_PROBS_FILE
    from swalab.train import PREDICTIONS_FILE

    out: dict[str, dict] = {}
    swa = [(c, cell) for c, cell in sorted(row.cells.items(), key=lambda kv: kv[0].order) if c.method == "swa"]
    for fge_column, fge_cell in row.cells.items():
        if fge_column.method != "fge":
            continue
        block = {"consecutive_l2": [], "max_agreement": [], "vs": defaultdict(lambda: {"l2": [], "agreement": []}),
                 "seeds": []}
        for entry in fge_cell.entries:
            members = _load_probs(entry.run.path / MEMBER_PROBS_FILE)
            if not members or len(members.get("member_probs", [])) < 1:
                continue
            singles = {}
            for swa_column, swa_cell in swa:
                twin = next((e for e in swa_cell.entries if e.run.seed == entry.run.seed), None)
                saved = _load_probs(twin.run.path / PREDICTIONS_FILE) if twin else None
                if saved and twin.predictor in saved["probs"] and saved["labels"].equal(members["labels"]):
                    singles[swa_column.label] = saved["probs"][twin.predictor].float()
            result = section35([p.float() for p in members["member_probs"]], singles)
            block["seeds"].append(entry.run.seed)
            if result["consecutive"] is not None:
                block["consecutive_l2"].append(result["consecutive"]["mean_l2"])
                block["max_agreement"].append(result["consecutive"]["max_agreement"])
            for label, pair in result["vs_ensemble"].items():
                block["vs"][label]["l2"].append(pair["l2"])
                block["vs"][label]["agreement"].append(pair["agreement"])
        if block["seeds"]:
            block["vs"] = dict(block["vs"])
            out[fge_column.label] = block
    return out


def section35_markdown(table: Table) -> list[str]:
    lines = []
    for row in table.rows:
        for fge_label, block in section35_of(row).items():
            lines.append([row.name, f"{fge_label}: consecutive members", fmt_cell(block["consecutive_l2"], 4),
                          fmt_cell(block["max_agreement"])])
            for swa_label, pair in block["vs"].items():
                lines.append([row.name, f"{swa_label} vs the {fge_label} ensemble", fmt_cell(pair["l2"], 4),
                              fmt_cell(pair["agreement"])])
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


def to_markdown(table: Table, paper: dict | None = None) -> str:
    columns = table.columns
    header = ["row", *(c.label for c in columns)]
    out: list[str] = []
    for metric, title in METRICS:
        digits = 2 if metric == "acc" else 4
        lines = []
        for row in table.rows:
            lines.append([row.name, *(fmt_cell(row.cells[c].values(metric), digits) if c in row.cells else "–"
                                      for c in columns)])
            published = paper_row(paper, row.dataset, row.model) if paper and metric == "acc" and not row.label else None
            if published is not None:
                lines.append([f"{row.name} (paper)", *(published.get(c.paper, "–") for c in columns)])
        out += [f"## {title}", "", *_markdown_table(header, lines), ""]
    diffs = [(row, paired_differences(row)) for row in table.rows]
    diffs = [(row, d) for row, d in diffs if d]
    if diffs:
        diff_columns = sorted({c for _, d in diffs for c in d}, key=lambda c: c.order)
        lines = [[row.name, *(_fmt_diff(d.get(c)) for c in diff_columns)] for row, d in diffs]
        out += ["## Paired differences against SGD (accuracy points, per seed)", "",
                "Each seed's accuracy minus the SGD run of the same seed and row; mean ± sample std over the seeds "
                "both hold.", "", *_markdown_table(["row", *(f"{c.label} − SGD" for c in diff_columns)], lines), ""]
    out += section35_markdown(table)
    out.append("Mean ± sample std over seeds; n = number of seeds (finished runs, each config and seed once). "
               "Columns: method, budget B, and the epochs trained.")
    if paper:
        out.append(f"Paper rows: {paper.get('source', 'Izmailov et al. 2018')}.")
    lineage = [f"- {row.name}, {c.label}, seed {e.run.seed}: branched from {e.run.lineage.get('parent')} at epoch "
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
            writer.writerow([shown_path(r.path, roots), r.status, r.dataset, r.model, r.method,
                             f"{float(r.get('method.budget', 1.0) or 0):g}", r.get("trainer.epochs"), r.seed,
                             group_hash(r.identity), *accs, (r.error or "").splitlines()[0] if r.error else ""])


# -- plots ---------------------------------------------------------------------------------------------

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


def plot_test_error(table: Table, path: Path) -> bool:
    """Test error (%) against epoch: mean over seeds per column; SWA's average dashed."""
    rows = [r for r in table.rows if any("test_acc" in h for run in r.runs() for h in run.history)]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = _panels(plt, len(rows), 6, 4)
    for ax, row in zip(axes, rows):
        for column in sorted(row.cells, key=lambda c: c.order):
            runs = [e.run for e in row.cells[column].entries]
            for key, suffix, style in (("test_acc", "", "-"), ("swa_test_acc", " (average)", "--")):
                points: dict[int, list[float]] = defaultdict(list)
                for run in runs:
                    for h in run.history:
                        if key in h and int(h["epoch"]) <= column.epochs:
                            points[int(h["epoch"])].append(100.0 - float(h[key]))
                if points:
                    epochs = sorted(points)
                    live = " (live model)" if column.method == "swa" and key == "test_acc" else ""
                    ax.plot(epochs, [statistics.fmean(points[e]) for e in epochs], style, marker="o", ms=3,
                            label=f"{column.label}{suffix}{live}")
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


# -- the command -------------------------------------------------------------------------------------

def problems_of(runs: Sequence[Run], table: Table) -> list[str]:
    """Plain-language notes about what the input holds that the table cannot show."""
    notes = []
    for r in runs:
        if not r.finished:
            why = f": {r.error.splitlines()[0]}" if r.error else ""
            notes.append(f"{r.status}: {r.path}{why}")
    notes += table.duplicates
    datasets = sorted({r.dataset for r in runs if r.finished})
    if len(datasets) > 1:
        notes.insert(0, f"the runs mix {len(datasets)} datasets ({', '.join(datasets)}): "
                        "one table row per dataset and model, never averaged across datasets")
    return notes


def report(roots: Sequence[str | Path], out: str | Path, paper: bool = False, wandb_mode: str | None = None,
           wandb_project: str | None = None, wandb_entity: str | None = None) -> dict:
    """Collect runs below ``roots``, write the tables, CSVs and plots to ``out``; return what was found.

    ``wandb_mode`` (``online`` | ``offline``) also builds the W&B Report (``swalab.wandb_report``); its
    project and entity default to the runs' own.
    """
    out = Path(out)
    missing = [str(r) for r in roots if not Path(r).exists()]
    if missing:
        raise FileNotFoundError(f"no such directory: {', '.join(missing)}")
    runs = [read_run(p) for p in run_dirs(roots)]
    finished = [r for r in runs if r.finished]
    table = build_table(runs)
    notes = problems_of(runs, table)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if finished:
        (out / "table.md").write_text(to_markdown(table, load_paper_tables() if paper else None)
                                      + ("\n## Not in the table\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
                                         if notes else ""))
        write_csv(table, out / "table.csv")
        written.update({"table.md": out / "table.md", "table.csv": out / "table.csv"})
        for name, plot in (("test_error", plot_test_error), ("fge_curve", plot_fge_curve),
                           ("reliability", plot_reliability)):
            if plot(table, out / f"{name}.png"):
                written[f"{name}.png"] = out / f"{name}.png"
    if runs:
        write_runs_csv(runs, out / "runs.csv", roots)
        written["runs.csv"] = out / "runs.csv"
    wandb = None
    if wandb_mode and finished:
        from swalab.wandb_report import SPEC_FILE, publish_report

        wandb = publish_report(table, out, wandb_mode, project=wandb_project, entity=wandb_entity,
                               paper=load_paper_tables())
        if wandb["spec"] is not None:
            written[SPEC_FILE] = wandb["spec"]
    return {"runs": runs, "finished": finished, "table": table, "notes": notes, "written": written, "wandb": wandb}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swalab.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="output directories, run directories or grid records to read")
    parser.add_argument("--out", default="report", help="where the table, CSVs and plots go (default: report/)")
    parser.add_argument("--paper", action="store_true", help="show the paper's numbers (Tables 1 and 2) beside ours")
    parser.add_argument("--wandb", action="store_true",
                        help="also build a W&B Report: saved online, else its spec "
                             "is written next to table.md with the command that publishes it")
    parser.add_argument("--wandb-mode", default="offline", choices=["online", "offline"], help="W&B mode (offline)")
    parser.add_argument("--wandb-project", default=None, help="W&B project (default: the runs', else swalab)")
    parser.add_argument("--wandb-entity", default=None, help="W&B entity (default: the runs', else yours)")
    args = parser.parse_args(argv)
    try:
        result = report(args.dirs, args.out, paper=args.paper, wandb_mode=args.wandb_mode if args.wandb else None,
                        wandb_project=args.wandb_project, wandb_entity=args.wandb_entity)
    except (FileNotFoundError, ImportError) as exc:  # ImportError: --wandb without wandb-workspaces
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
    published = result["wandb"]
    if published is not None:
        if published["url"]:
            print(f"[swalab.report] W&B report: {published['url']}")
        else:
            why = f" (saving it failed: {published['error']})" if published["error"] else ""
            print(f"[swalab.report] W&B report written offline to {published['spec']}{why}; publish it with:\n"
                  f"  {published['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
