"""How finished runs become a table that never mixes or double-counts them (``python -m swalab.results.report``).

* a **cell** holds the runs of one identity minus the seed (``swalab.identity``): one config, its
  seeds. Each (identity, seed) counts once, however many directories hold it (the others are
  listed as duplicates);
* a **row** holds the cells whose identities differ only in the method (``method.*``, the run's
  length, the schedule's horizon): the SGD, FGE, SWA and EMA of one setting. Runs that differ in
  anything else (a training-set size, a batch size, a data set) are separate rows, labelled with the
  keys that set them apart (only the images, a folder that changed between two grids: ``data.fingerprint=<hex>``). A method run only with settings of its own (the row tool's SWA branch,
  ``model.swa.pre_schedule=base``) stands in the row, its settings named in the row's notes; two configs of
  one method in one row (say two SWA learning rates) put the second in a row of its own, labelled with
  the keys that differ;
* a **column** is a method at a budget, with the epochs behind it (``SWA 1.25B (188 ep)``). Each
  predictor's ``metrics.json`` entry says the budget and epoch behind it, so a SWA run contributes to
  its own column and, through its ``swa@<b>`` predictors (``model.swa.score_at_budgets``), to the
  columns of the earlier budget marks, without a name being parsed. A predictor at its fitted
  temperature (``swa+ts``, runs with a validation split) is a column of its own beside its predictor's;
  a SWAG run fills the SWA columns too where no SWA run does (``Method.stands_in``). Columns stand in the order
  the methods declare (``swalab.methods.column_rank``), a method of one's own after the built-in ones."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from swalab.calibration import SUFFIX, base_name
from swalab.identity import METHOD_RECIPES, differences, group_hash, identity_hash, label_of, method_part
from swalab.methods import column_rank
from swalab.results.runs import Run
from swalab.rundir import RunDir
from swalab.style import label_items

# The name an average built after training (swalab.posthoc) has among its run's predictors: ``posthoc:<label>``
POSTHOC_ENTRY = "posthoc:"


@dataclass(frozen=True)
class Column:
    """A method at a budget, with the epochs behind it; ``swa+ts`` is SWA's predictor at its fitted temperature
    (``swalab.calibration``), a column of its own beside SWA's. A method that trains nothing (``Method.trains``:
    pretrained, Laplace) has neither budget nor epochs to show."""

    method: str
    budget: float
    epochs: int
    posthoc: bool = False  # built after training from the run's weights (swalab.posthoc): ``method`` is its label
    of: str = ""  # a post-hoc predictor's run's method (``lawa2`` of an SGD run and of an EMA run are two columns), or
    #               the method of the run one that trains nothing starts from (Laplace around an SGD run)
    trains: bool = field(default=True, compare=False)  # the method's own (Method.trains): told by its name alone

    @property
    def base(self) -> str:
        """The method without ``+ts``."""
        return base_name(self.method)[0]

    @property
    def scaled(self) -> bool:
        """Whether the column is a predictor at its fitted temperature (``+ts``)."""
        return base_name(self.method)[1]

    @property
    def name(self) -> str:
        """``SWA``, ``SWAG-diag``, ``SWA+ts``: the method as a label shows it; a post-hoc predictor by its own label
        and the method of the run whose weights it averages (``swa[12:16] of SWA``, ``lawa5+ts of SGD``)."""
        if self.posthoc:
            return f"{self.method} of {title_of(self.of)}" if self.of else self.method
        return title_of(self.base) + (SUFFIX if self.scaled else "")

    @property
    def label(self) -> str:
        """``SWA 1.25B (188 ep)``; ``Pretrained+ts`` for a method that trains nothing (no B, no epochs), ``Laplace of
        SGD 1B (30 ep)`` for one that trains nothing around a run of the table (``of``: that run's method, at its
        budget and epochs)."""
        if not self.trains:
            return self.name + (f" of {title_of(self.of)} {self.budget:g}B ({self.epochs} ep)" if self.of else "")
        return f"{self.name} {self.budget:g}B ({self.epochs} ep)"

    @property
    def order(self) -> tuple:
        return column_rank(self.base) + 1000 * self.posthoc, self.budget, self.epochs, self.scaled, self.method

    @property
    def paper(self) -> str:
        """The paper's name for the column (Tables 1 and 2)."""
        if self.scaled or self.posthoc:
            return self.label  # not in the paper
        if self.method in ("sgd", "pretrained"):
            return "SGD"
        if self.method == "fge":
            return f"FGE ({self.budget:g}B)"
        return f"{title_of(self.method)} {self.budget:g}B"


@dataclass
class Entry:
    """One predictor of one run, as a table sees it."""

    run: Run
    predictor: str
    column: Column
    metrics: dict
    stands_in: bool = False  # a predictor of another method's column (``Method.stands_in``): a run of it goes first

    @property
    def cell(self) -> tuple[str, str]:
        return group_hash(self.run.identity), self.predictor


ACRONYMS = ("sgd", "swa", "swag", "fge", "ema", "map")  # predictors named by their initials


def title_of(predictor: str) -> str:
    """``SWA``, ``SWAG-diag``, ``Laplace``, ``Pretrained``: a predictor's family as column labels show it."""
    if predictor.removesuffix("_diag") in ACRONYMS:
        return predictor.upper().replace("_DIAG", "-diag")
    return predictor.capitalize()


def entries_of(run: Run) -> list[Entry]:
    """The run's own predictors (``sgd`` of an SGD run, ``swa`` of a SWA run...), SWA's budget marks, each at its
    fitted temperature (``<name>+ts``) too, the predictors it stands in for (``Method.stands_in``: a SWAG run fills
    SWA's columns where no SWA run does, python -m swalab.results.row --swag; build_table), and those built after
    training (``swalab.posthoc``: columns of their own, after the methods', at the run's budget, named with its
    method)."""
    out = []
    epochs = int(run.get("trainer.epochs", 0) or 0)
    budget = float(run.get("method.budget", 1.0) or 0.0)
    fills = getattr(run.method_class, "stands_in", ())
    trains = getattr(run.method_class, "trains", True)
    for name, m in run.metrics.items():
        if not isinstance(m, dict) or "acc" not in m:
            continue
        base, scaled = base_name(name)
        family = base.split("@")[0]  # swa@1.25 is SWA at a budget mark
        own = family == run.method or family.startswith(f"{run.method}_")
        stands_in = family in fills
        if not (own or stands_in):
            continue  # e.g. the last iterate of a SWA run is not the SGD baseline
        column = Column(family + (SUFFIX if scaled else ""), float(m.get("budget", budget)), int(m.get("epoch", epochs)),
                        trains=trains)
        out.append(Entry(run, name, column, m, stands_in=stands_in))
    for name, m in run.posthoc.items():  # built after training (swalab.posthoc), labelled by what they average
        if "acc" in m:
            column = Column(name, budget, int(m.get("epoch", epochs)), posthoc=True, of=run.method)
            out.append(Entry(run, f"{POSTHOC_ENTRY}{name}", column, m))
    return out


def context_of(run: Run) -> dict:
    """The identity minus the seed and what only the method decides: the key of a table row."""
    return {k: v for k, v in run.identity.items() if k != "seed" and not method_part(k)}


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
    shares_with: "Row | None" = None         # the row of the same settings but the method's own (its SGD baseline)
    own: dict[str, str] = field(default_factory=dict)  # per method of its runs, their own settings ("" the defaults)

    def sgd_cells(self) -> dict[Column, Cell]:
        """The SGD columns a column of this row is paired with: its own, else those of the row it shares with."""
        own = {c: cell for c, cell in self.cells.items() if c.method == "sgd"}
        if own or self.shares_with is None:
            return own
        return {c: cell for c, cell in self.shares_with.cells.items() if c.method == "sgd"}

    @property
    def notes(self) -> str:
        """``SWA, SWAG: model.swa.pre_schedule=base``: the columns of the row whose runs ran with settings of their
        own (a SWAG run's SWA columns among them), by setting."""
        by_setting: dict[str, list[str]] = defaultdict(list)
        for column in sorted(self.cells, key=lambda c: c.order):
            setting = self.setting_of(column, own_only=True)
            if setting and title_of(column.base) not in by_setting[setting]:
                by_setting[setting].append(title_of(column.base))
        return "; ".join(f"{', '.join(columns)}: {setting}" for setting, columns in by_setting.items())

    def setting_of(self, column: Column, own_only: bool = False) -> str:
        """What sets the runs of ``column`` apart from the defaults: the row's label (unless ``own_only``) and their
        method's own settings."""
        cell = self.cells.get(column)
        own = self.own.get(cell.entries[0].run.method, "") if cell and cell.entries else ""
        return own if own_only else "; ".join(p for p in (self.label, own) if p)

    @property
    def caption(self) -> str:
        """What sets the row apart and the methods' own settings of its columns: ``dataset.train_size=1000; SWA:
        model.swa.pre_schedule=base``."""
        return "; ".join(p for p in (self.label, self.notes) if p)

    @property
    def name(self) -> str:
        return f"{self.dataset} / {self.model}" + (f" · {self.caption}" if self.caption else "")

    @property
    def title_items(self) -> list[str]:
        """``["cifar10 / vgg16", "dataset.train_size=1000", "SWA: model.swa.pre_schedule=base"]``: what a figure's
        panel titles are made of (``swalab.style.panel_titles``)."""
        return [*label_items(f"{self.dataset} / {self.model}", self.label), *([self.notes] if self.notes else [])]

    def runs(self) -> list[Run]:
        return [e.run for cell in self.cells.values() for e in cell.entries]


@dataclass
class Table:
    rows: list[Row]
    duplicates: list[str]

    @property
    def columns(self) -> list[Column]:
        return sorted({c for row in self.rows for c in row.cells}, key=lambda c: c.order)

    def header(self, column: Column) -> str:
        """The column's label in this table's headers: with its B (``SWA 1.5B (6 ep, B = 4)``) when the table's
        columns differ in B, so that ``SGD 1B (6 ep)`` beside ``SWA 1.5B (6 ep)`` cannot hide that they do."""
        b = budget_epochs_of(column)
        if b is None or not budgets_differ(self.columns):
            return column.label
        return f"{column.name} {column.budget:g}B ({column.epochs} ep, B = {b:.3g})"


def budgets_differ(columns: Sequence[Column]) -> bool:
    """Whether the trained ``columns`` stand on more than one B: B is the epochs of a 1-budget column, and a column
    of another budget shares it when its epochs are that B's, rounded by the rule that made them (SWA 1.25B of
    B = 5 is 6 ep); a column of no budget (``method=pretrained``) has no B."""
    from swalab.config import epochs_of_budget

    trained = [c for c in columns if c.budget]
    bases = {c.epochs for c in trained if c.budget == 1} or {budget_epochs_of(c) for c in trained[:1]}
    if len(bases) > 1:
        return True
    return any(epochs_of_budget(c.budget, base) != c.epochs for base in bases for c in trained)


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


# Settings a column's label already shows (its method, budget and epochs): never repeated in a row's label.
IN_COLUMN = ("method.name", "method.budget", "trainer.epochs")


def scoring_settings(run: Run) -> set[str]:
    """The keys of the run's method that only add measurements (``Method.scoring_settings``), as a user types them:
    ``method.score_every``, or the recipe block's key it reads (``model.swa.score_every``)."""
    names = getattr(run.method_class, "scoring_settings", ())
    return {f"{prefix}.{name}" for name in names for prefix in ("method", *METHOD_RECIPES)}


def own_settings(run: Run, measurements: bool = False) -> dict | None:
    """The run's settings apart from its defaults (``Run.apart``) that only its method reads (``method.*``, named by
    the recipe block key they read, ``model.swa.*`` for SWA: ``identity.method_part``), less what the column shows
    and, unless ``measurements``, what only adds measurements; None when the run has no record of them."""
    if run.apart is None:
        return None
    skip = set() if measurements else scoring_settings(run)
    return {k: v for k, v in run.apart.items() if k not in IN_COLUMN and k not in skip
            and _own(k)}


def _own(key: str) -> bool:
    """Whether a settings-apart key is its method's own (``method.*``, a recipe block's key): not ``trainer.epochs``,
    which the column shows, nor the schedule's horizon, which rows share."""
    return method_part(key) and not key.startswith(("trainer.", "schedule."))


def shared_settings(run: Run) -> dict | None:
    """The run's settings apart from its defaults that every method of its row shares (``dataset.train_size=1000``,
    ``schedule=cosine``): none that only its method decides (``identity.method_part``: the schedule's horizon a SWA
    branch runs on is not its row's); None without a record."""
    if run.apart is None:
        return None
    experiment = {"experiment": run.experiment} if run.experiment else {}  # its own settings are no override
    return {**experiment, **{k: v for k, v in run.apart.items() if not method_part(k)}}


def _first_written(entries: Sequence[Entry]) -> float:
    times = [(e.run.path / RunDir.CONFIG).stat().st_mtime for e in entries if (e.run.path / RunDir.CONFIG).exists()]
    return min(times, default=0.0)


def named_apart(cells: dict[tuple[str, str], dict], keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict | None]:
    """Per cell of ``keys`` (one row's context), its method's own settings as the row names them (:func:`own_settings`;
    None without a record), so that no two configs of one method, in any of the row's columns, are named alike: those
    that would be are named with what they measure too (``model.swa.score_every``), then with every setting of their
    method's they were launched with (the schedule's horizon the row tool sets). A grid's SWA of
    ``model.swa.pre_schedule=base`` and the row tool's SWA branch of the same setting are two rows, never one row of
    both runs' columns."""
    run = {k: cells[k]["entries"][0].run for k in keys}
    own = {k: own_settings(run[k]) for k in keys}
    for widened in (lambda r: own_settings(r, measurements=True), _method_settings):
        groups: dict[tuple[str, str], set[str]] = defaultdict(set)  # (method, label) -> the configs named so
        for k, o in own.items():
            if o is not None:
                groups[(run[k].method, label_of(o))].add(k[0])
        own = {k: widened(run[k]) if o is not None and len(groups[(run[k].method, label_of(o))]) > 1 else o
               for k, o in own.items()}
    return own


def _method_settings(run: Run) -> dict:
    """Every setting apart from its defaults that the run's method decides (``identity.method_part``: its own, what it
    measures, the schedule's horizon), less what its column shows."""
    return {k: v for k, v in run.apart.items() if method_part(k) and k not in IN_COLUMN}


def around_sources(cells: dict[tuple[str, str], dict]) -> None:
    """Put each cell of a method that trains nothing around another run of the table (``method=laplace
    model.init_from=<SGD run>``: its identity names the source's group, ``run-<group hash>``) in its source's row:
    the source's context, and a column of the source's method, budget and epochs (``Laplace of SGD 1B (30 ep)``), so
    that it is paired with its source run seed by seed. Every setting the cell records must be the source's (it records
    no optimizer: it trains nothing). A source picked at an epoch or of another seed (``run-<hash>@<k>``,
    ``-seed<k>``), or one not in the table, leaves the cell in a row of its own."""
    sources = {key[0]: cell for key, cell in cells.items() if not cell["stands_in"]}
    for cell in cells.values():
        run = cell["entries"][0].run
        value = cell["context"].get("model.init_from")
        if getattr(run.method_class, "trains", True) or not isinstance(value, str) or not value.startswith("run-"):
            continue
        source = sources.get(value.removeprefix("run-"))
        if source is None or source["column"].posthoc or any(  # what it records (no optimizer: it trains nothing)
                source["context"].get(k, v is None) != v for k, v in cell["context"].items() if k != "model.init_from"):
            continue
        of = source["column"]
        column = dataclasses.replace(cell["column"], budget=of.budget, epochs=of.epochs, of=of.base)
        cell.update(context=source["context"], column=column, around=True)
        for entry in cell["entries"]:
            entry.column = column


def build_table(runs: Sequence[Run]) -> Table:
    """Cells by identity minus seed (each seed once), rows by identity minus seed and method (module doc)."""
    duplicates: list[str] = []
    cells: dict[tuple[str, str], dict] = {}
    seen: dict[tuple[str, str], Run] = {}
    for run in sorted((r for r in runs if r.finished), key=lambda r: str(r.path)):
        for entry in entries_of(run):
            once = (identity_hash(run.identity), entry.predictor)
            if once in seen:
                line = f"{run.path} repeats {seen[once].path} (same config and seed): counted once"
                if line not in duplicates:  # once per copy, not per predictor
                    duplicates.append(line)
                continue
            seen[once] = run
            cells.setdefault(entry.cell, {"entries": [], "context": context_of(run), "column": entry.column,
                                          "stands_in": entry.stands_in})
            cells[entry.cell]["entries"].append(entry)
    place = lambda c: (json.dumps(c["context"], sort_keys=True, default=str), c["column"])  # noqa: E731
    taken = {place(c) for c in cells.values() if not c["stands_in"]}
    cells = {k: c for k, c in cells.items() if not (c["stands_in"] and place(c) in taken)}
    around_sources(cells)
    contexts: dict[str, dict] = {}  # one row per distinct context, its cells by column
    for key, cell in cells.items():
        ctx_key = json.dumps(cell["context"], sort_keys=True, default=str)
        contexts.setdefault(ctx_key, {"context": cell["context"], "columns": defaultdict(list)})
        contexts[ctx_key]["columns"][cell["column"]].append(key)
    rows: list[Row] = []
    contexts_of: dict[int, dict] = {}  # id(row) -> its context, for rows whose labels would read alike
    by_pair: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for ctx in contexts.values():
        c = ctx["context"]
        by_pair[(str(c.get("dataset.name", "?")), str(c.get("model.name", "?")))].append(ctx)
    for (dataset, model), group in sorted(by_pair.items()):
        varying = sorted({k for ctx in group for k in set(ctx["context"]) | set(group[0]["context"])
                          if any(ctx["context"].get(k) != group[0]["context"].get(k) for ctx in group)})
        runs_in = lambda g: sum(len(cells[k]["entries"]) for keys in g["columns"].values() for k in keys)  # noqa: E731
        for ctx in sorted(group, key=lambda g: (-runs_in(g), _label(varying, g["context"]))):
            for row in _rows_of_context(cells, ctx, dataset, model, varying):
                contexts_of[id(row)] = ctx["context"]
                rows.append(row)
    tell_apart(rows, contexts_of)
    for row in rows:
        for cell in row.cells.values():
            cell.entries.sort(key=lambda e: (str(e.run.seed), str(e.run.path)))
    return Table(rows, duplicates)


def _rows_of_context(cells: dict[tuple[str, str], dict], ctx: dict, dataset: str, model: str,
                     varying: Sequence[str]) -> list[Row]:
    """The rows of one context: its methods' default configs in one row, first; a method run with one config of its
    own only (the row tool's SWA branch, ``model.swa.pre_schedule=base``) stands in that row too, its settings in the
    row's notes; a method of several configs (a sweep of SWA's lr) puts each but the default in a row of its own,
    those of one label sharing a row where their columns do not overlap."""
    in_row = [k for keys in ctx["columns"].values() for k in keys]
    # the row is named by a run of its own: one moved into it around its source (Laplace) records that source
    shared = shared_settings(cells[min(in_row, key=lambda k: bool(cells[k].get("around")))]["entries"][0].run)
    # the settings the runs recorded, in the keys the user typed; runs of earlier versions: the keys that vary
    base_label = label_of(shared) if shared is not None else _label(varying, ctx["context"])
    main: dict[Column, Cell] = {}
    noted: dict[str, str] = {}  # per method of the row's runs, its own settings in the row ("" the defaults)
    extra: list[Row] = []
    own = named_apart(cells, in_row)
    # per column its cells, the default config of the method first; without records, the variant with most seeds,
    # then the first written
    columns = [(column, sorted(keys, key=lambda k: (bool(own[k]), -len(cells[k]["entries"]),
                                                    _first_written(cells[k]["entries"]), k)))
               for column, keys in ctx["columns"].items()]
    configs = defaultdict(set)
    for k in in_row:
        configs[cells[k]["entries"][0].run.method].add(k[0])
    for column, variants in sorted(columns, key=lambda c: (bool(own[c[1][0]]), c[0].order)):
        lead = variants[0]
        method = cells[lead]["entries"][0].run.method
        setting = label_of(own[lead]) if own[lead] else ""
        if (not setting or len(configs[method]) == 1) and noted.setdefault(method, setting) == setting:
            main[column] = Cell(cells[lead]["entries"])
        else:
            variants, lead = ["<none>", *variants], None
        first = cells[lead]["entries"][0].run.identity if lead else {}
        for k in variants[1:]:
            other = cells[k]["entries"][0].run
            if own[k] is not None:
                label = label_of(own[k])
            else:
                keys_apart = [d.split(":")[0] for d in differences(other.identity, first) if not d.startswith("seed:")]
                label = _label(keys_apart, other.identity)
            extra.append(Row(dataset, model, ", ".join(p for p in (base_label, label) if p),
                             {column: Cell(cells[k]["entries"])}))
    plain = Row(dataset, model, base_label, main, own=noted) if main else None  # else shown by its variants' rows
    merged: dict[str, list[Row]] = {}  # rows of one label share a row: a SWA run's budget columns together
    for row in extra:
        row.shares_with = plain
        same = merged.setdefault(row.label, [])
        target = next((r for r in same if not set(r.cells) & set(row.cells)), None)
        if target is None:
            same.append(row)
        else:
            target.cells.update(row.cells)
    return ([plain] if plain else []) + [r for label in sorted(merged) for r in merged[label]]


def tell_apart(rows: Sequence[Row], contexts_of: dict[int, dict]) -> None:
    """Name rows of other contexts that would read alike by the identity keys their contexts differ in. What a user
    typed can be the same for runs of other experiments: a folder of images that changed between two grids
    (``data.fingerprint``), so that both rows would read ``digits28 / tiny_cnn`` though each holds other runs."""
    alike: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for row in rows:
        alike[(row.dataset, row.model, row.label)].append(row)
    for same in alike.values():
        contexts = [contexts_of[id(row)] for row in same]
        keys = sorted({k for c in contexts for k in set(c) | set(contexts[0]) if c.get(k) != contexts[0].get(k)})
        if not keys:
            continue
        for row, context in zip(same, contexts):
            row.label = ", ".join(p for p in (row.label, _label(keys, context)) if p)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def mean_pm(values: Sequence[float] | None, digits: int, sign: bool = False) -> str:
    """``mean ± std`` over seeds (a single value alone; "–" for none): a cell of a markdown table."""
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:{'+' if sign else ''}.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(line) + " |" for line in lines)]


def fmt_cell(values: Sequence[float], digits: int = 2) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f} (n={len(values)})" if std is not None else \
        f"{mean:.{digits}f} (n=1)"


def budget_epochs_of(column: Column) -> float | None:
    """B of a column: its epochs over its budget (SWA 1.5B (45 ep) has B = 30)."""
    return column.epochs / column.budget if column.budget else None


def sgd_baseline(row: Row, column: Column) -> Column | None:
    """The row's SGD column (or, for a row of a method's other settings, that of the row it shares all else with)
    of exactly the same budget B as ``column``: SWA 1.5B (45 ep) is set against SGD 1B
    (30 ep), never against an SGD run of another length (SWA 1.5B (8 ep), B = 5.33, has no SGD twin at 6 ep).
    Epochs are whole, so B matches exactly when the column's epochs are the SGD run's epochs times its budget,
    rounded by the rule that made them (``swalab.config.budget_epochs``: 1.25 x 150 = 188). A column of no budget
    (``method=pretrained``: nothing trained) has no B and so no twin, whatever SGD runs share its row."""
    from swalab.config import epochs_of_budget

    b = budget_epochs_of(column)
    if b is None:
        return None
    candidates = [c for c in row.sgd_cells() if c.budget == 1 and epochs_of_budget(column.budget, c.epochs) == column.epochs]
    return min(candidates, key=lambda c: abs(c.epochs - b)) if candidates else None


def of_several_runs(cell: Cell) -> bool:
    """Whether the cell holds a post-hoc average of several runs (a soup of seeds, ``rebuild_runs`` in its record):
    stored under one of them, it averages them all, so no one seed's SGD run pairs with it."""
    return any(len(e.metrics.get("rebuild_runs") or ()) > 1 for e in cell.entries)


def paired_differences(row: Row, metric: str = "acc") -> dict[Column, list[float]]:
    """Per seed, each column minus the row's SGD column of the same budget B (:func:`sgd_baseline`), over the
    seeds both hold; a column without such an SGD column is left out."""
    out = {}
    for column, cell in row.cells.items():
        if column.method == "sgd" and column.budget == 1 or of_several_runs(cell):
            continue
        baseline = sgd_baseline(row, column)
        if baseline is None:
            continue
        base, mine = row.sgd_cells()[baseline].by_seed(metric), cell.by_seed(metric)
        shared = [s for s in mine if s in base]
        if shared:
            out[column] = [mine[s] - base[s] for s in sorted(shared, key=str)]
    return out
