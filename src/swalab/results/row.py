"""One row of the paper's Table 1 (SGD, FGE at 1 budget, SWA at 1, 1.25 and 1.5 budgets) per seed.

    python -m swalab.results.row --dataset cifar10 --model preresnet20 --seeds 0 1 [key=value overrides]
    python -m swalab.results.row ... --dry-run      # print the commands in dependency order (for SLURM, see docs/branching.md)
    python -m swalab.results.row ... --naive        # the five runs trained straight through, for comparison
    python -m swalab.results.row ... --swag         # SWAG and SWAG-diag beside SWA, from the same branch
    python -m swalab.results.row ... --method polyak  # a further method's columns (one of one's own too)

When to use it: the five runs of a row share most of their epochs. Trained naively they cost
5.75 budgets per seed; branched they cost about 2: one SGD trunk (``method=sgd``, 1 budget) keeps
the checkpoints of the branch points (``run.save_at``), one SWA run branches off it at
``swa_start - 1`` and trains to the largest budget, scoring its average at the smaller budget
marks on the way (predictors ``swa@1``, ``swa@1.25``, ``swa``), and FGE branches off it at its
``pretrain_epochs``. Each branch equals the run trained straight through (``swalab.branching``),
so both modes give the same table. With ``--swag`` that SWA branch is a SWAG run (``method=swag``), which trains
exactly as SWA does and scores SWA's predictors beside its own: one branch fills the SWA columns and the SWAG ones
(``SWAG``, ``SWAG-diag`` at the largest budget); its cost over SWA's is SWAG's test-time sampling
(``bench/swag_cost.py``).

Each job is ``python run.py <overrides>`` in a subprocess, run one after another, trunk first; a
job whose run directory already holds ``metrics.json`` is skipped, so an interrupted row is
re-launched with the same command. The run directories are the ones ``run.py`` would pick
(``run.save_at`` and ``run.branch_from`` stay out of their names), and
``<paths.output_dir>/rows/<dataset>_<model>_<trunk config>_seed<N>.json`` maps each Table 1 column to the run
(relative to the output directory, so the record moves with it) and predictor that hold it, and keeps
what its last launch trained and how long that took (``launch``). The report reads the runs'
``metrics.json`` and, for the row's wall time, their ``history.jsonl`` (``row_cost``)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.cli import Terminated, described, run_command
from swalab.config import ConfigError
from swalab.methods import SWAG, column_rank, columns_of
from swalab.methods.swa import budget_predictor
from swalab.results.table import title_of
from swalab.train.build import build_method
from swalab.train.plan import locate
from swalab.train.plan import (apart_from_defaults, check_typed_values_read, defaults_of, identity_for,
                               validate)
from swalab.rundir import DamagedRecord, RunDir, read_json, write_text

REPO = Path(__file__).resolve().parents[3]
SWA_BUDGETS = (1.0, 1.25, 1.5)  # the paper's SWA columns (section 4.1)
NOMINAL_STEPS = 100  # steps per epoch used to compare per-iteration schedules when placing branch points


class RowError(RuntimeError):
    """A job of the row failed; the row stops there (finished jobs are kept and skipped next time)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class Job:
    """One run of the row: its ``run.py`` overrides, where it lands, and what it branches from."""

    name: str                                  # sgd | swa | swa_b<budget> (naive) | a further method (fge)
    overrides: list[str]
    run_dir: Path
    parent: str | None = None                  # the job it branches from
    branch_epoch: int | None = None
    columns: dict[str, str] = field(default_factory=dict)  # Table 1 column -> predictor in this run

    def command(self) -> list[str]:
        return [sys.executable, str(REPO / "run.py"), *self.overrides]


def compose_run(overrides: list[str]) -> DictConfig:
    """The config ``run.py`` would compose for ``overrides`` (with Hydra's section, for the group choices)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def run_dir_of(cfg: DictConfig, overrides: list[str]) -> Path:
    """Where ``python run.py <overrides>`` trains: the directory ``swalab.train`` names from the config (what sets it
    apart from its defaults, composed as run.py composes them). The config is first checked as run.py checks it
    (``swalab.train.validate``: a mandatory ``???`` key left unset, a bad value), so that a row refuses what its
    jobs would refuse before any of them runs."""
    task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    choices = dict(cfg.hydra.runtime.choices)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        default = defaults_of(task, choices)
    check_typed_values_read(task, overrides, default)
    validate(task)
    identity = identity_for(task)[0]
    settings = apart_from_defaults(task, identity, choices, default)
    return locate(task, identity, settings, choices).resolve()


def method_of(cfg: DictConfig):
    return build_method(cfg, int(cfg.trainer.epochs))


def agree_until(child, trunk, epochs: int) -> int:
    """The number of leading epochs over which ``child`` and ``trunk`` use the same learning rates."""
    for e in range(epochs):
        for s in (0, NOMINAL_STEPS // 2, NOMINAL_STEPS - 1):
            if abs(child.step_lr(e, s, NOMINAL_STEPS) - trunk.step_lr(e, s, NOMINAL_STEPS)) > 1e-12:
                return e
    return epochs


def branch_point(child_cfg: DictConfig, trunk_cfg: DictConfig) -> int:
    """The latest trunk epoch the child can branch from and still equal its straight-through run."""
    child, trunk = method_of(child_cfg), method_of(trunk_cfg)
    trunk_epochs = int(trunk_cfg.trainer.epochs)
    limit = min(child.last_branch_epoch(), trunk_epochs)
    return min(limit, agree_until(child, trunk, trunk_epochs))


def plan_row(dataset: str, model: str, seed: int, extra: list[str] = (), swa_budgets=SWA_BUDGETS,
             methods: Sequence[str] = ("fge",), naive: bool = False, swag: bool = False) -> list[Job]:
    """The jobs of one row for one seed, in dependency order (the trunk first).

    ``methods`` are the row's further methods (``method=<name>``), one run of its own budget each, after SGD and
    SWA: each branches off the trunk as late as its lr agrees with the trunk's (``Method.last_branch_epoch``; a
    method that keeps state from its first step, as EMA, trains straight through) and fills the columns it declares
    (``Method.columns``). ``swag`` trains the run of the largest SWA budget as SWAG (``method=swag``: SWA's training,
    SWA's predictors and SWAG's), branched off the trunk where SWA's would be."""
    keys = _row_overrides(extra)
    base = [f"dataset={dataset}", f"model={model}", f"seed={seed}", *extra]
    trunk_ov = [*base, "method=sgd"]
    trunk_cfg = compose_run(trunk_ov)
    trunk_dir = run_dir_of(trunk_cfg, trunk_ov)  # checks the trunk's config first: what every job shares
    trunk_epochs = int(trunk_cfg.trainer.epochs)
    budgets = sorted(float(b) for b in swa_budgets)

    def swa_overrides(budget: float, marks: list[float], method: str = "swa") -> list[str]:
        out = [*base, f"method={method}", f"method.budget={budget:g}", "model.swa.pre_schedule=base"]
        if "model.swa.score_every" not in keys:  # the average's own test error each epoch, for test_error.png
            out.append("model.swa.score_every=1")
        if marks:
            out.append("model.swa.score_at_budgets=[" + ",".join(f"{b:g}" for b in marks) + "]")
        if "horizon" in trunk_cfg.schedule and int(compose_run(out).trainer.epochs) != trunk_epochs:
            out.append(f"schedule.horizon={trunk_epochs}")  # the SGD run's schedule, "not modified" (paper 3.2)
        return out

    others = []  # (name, overrides, config, columns) of each further method
    for name in methods:
        ov = [*base, f"method={name}"]
        cfg = compose_run(ov)
        method = method_of(cfg)
        others.append((name, ov, cfg, columns_for(method, method.budget)))
    if naive:
        jobs = [Job("sgd", trunk_ov, trunk_dir, columns={"SGD": "sgd"})]
        jobs += [Job(name, ov, run_dir_of(cfg, ov), columns=columns) for name, ov, cfg, columns in others]
        for b in budgets:
            last = swag and b == budgets[-1]
            ov = swa_overrides(b, [], "swag" if last else "swa")
            jobs.append(Job(f"swag_b{b:g}" if last else f"swa_b{b:g}", ov,
                            run_dir_of(compose_run(ov), ov),
                            columns={f"SWA {b:g}B": "swa", **(columns_for(SWAG, b) if last else {})}))
        return jobs

    swa_ov = swa_overrides(budgets[-1], budgets[:-1], "swag" if swag else "swa")
    children = [("swag" if swag else "swa", swa_ov, compose_run(swa_ov),
                 {**{f"SWA {b:g}B": budget_predictor(b) for b in budgets[:-1]},
                  f"SWA {budgets[-1]:g}B": "swa", **(columns_for(SWAG, budgets[-1]) if swag else {})}), *others]
    points = {name: branch_point(cfg, trunk_cfg) for name, _, cfg, _ in children}
    save_at = "run.save_at=[" + ",".join(str(k) for k in sorted(set(points.values()) - {0})) + "]"
    jobs = [Job("sgd", [*trunk_ov, save_at], trunk_dir, columns={"SGD": "sgd"})]
    for name, ov, cfg, columns in children:
        k = points[name]  # 0: the method keeps state from its first step and trains straight through
        jobs.append(Job(name, [*ov, f"run.branch_from={trunk_dir}@{k}"] if k else ov, run_dir_of(cfg, ov),
                        parent="sgd" if k else None, branch_epoch=k or None, columns=columns))
    return jobs


def _row_overrides(extra: Sequence[str]) -> dict[str, str]:
    """The row's overrides by key, refused (:class:`RowError`) where they set what the row sets itself."""
    keys = {o.lstrip("+").split("=", 1)[0]: o for o in extra}
    fixed = [o for k, o in keys.items() if k in ("trainer.epochs", "method.budget")]
    if fixed:
        raise RowError(f"{', '.join(fixed)}: a row's runs are 1, 1.25 and 1.5 budgets long, so their lengths come "
                       "from the budget B: set model.budget_epochs=<B> instead")
    owned = {"method": "a row trains every method itself (--no-fge, --ema, --method, --swa-budgets choose them)",
             "seed": "the row's seeds are --seeds", "dataset": "the row's data set is --dataset",
             "model": "the row's model is --model",
             "run.dir": "a row's jobs each need their own run directory (set paths.output_dir=<dir> instead)"}
    for key, why in owned.items():
        if key in keys:
            raise RowError(f"{keys[key]}: {why}")
    return keys


def columns_for(method, budget: float) -> dict[str, str]:
    """The row's columns a run of ``method`` at ``budget`` budgets fills (``FGE 1B``, ``SWAG-diag 1.5B``): those it
    declares (``Method.columns``), by the names reports give them."""
    return {f"{title_of(p)} {budget:g}B": p for p in columns_of(method)}


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run; a damaged ``metrics.json`` is not (the job runs and heals it)."""
    try:
        return RunDir(run_dir).final_metrics() is not None
    except DamagedRecord:
        return False


def run_jobs(jobs: list[Job], dry_run: bool = False) -> list[dict]:
    """Run the jobs in order (skipping finished ones); return what each cost in this launch: seconds and epochs."""
    done = []
    for job in jobs:
        record = {"name": job.name, "run_dir": str(job.run_dir), "branch_epoch": job.branch_epoch}
        if dry_run:
            print(shlex.join(job.command()))
            continue
        if finished(job.run_dir):
            print(f"[row] {job.name}: {job.run_dir} already finished; skipped")
            done.append({**record, "skipped": True, "seconds": 0.0, "epochs_trained": 0})
            continue
        print(f"[row] {job.name}: {' '.join(job.overrides)}", flush=True)
        t0 = time.perf_counter()
        child = subprocess.Popen(job.command())
        try:
            returncode = child.wait()
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (cli.Terminated): the job pauses at a checkpoint
            child.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
            child.wait()  # not subprocess.run, which kills it 0.25 s after Ctrl-C, before its checkpoint is written
            raise
        if returncode:
            raise RowError(f"job {job.name} ended with exit {returncode} (see above); the jobs before it are kept: "
                           "once what it says is dealt with, run the same command again to continue the row",
                           returncode)
        seconds = time.perf_counter() - t0
        done.append({**record, "skipped": False, "seconds": seconds,
                     "epochs_trained": len(trained_epochs(job.run_dir, job.branch_epoch or 0))})
    return done


def relative_to(run_dir: Path, output_dir: Path) -> str:
    """``run_dir`` relative to the output directory holding the record, so that the record moves with it."""
    try:
        return Path(run_dir).resolve().relative_to(Path(output_dir).resolve()).as_posix()
    except ValueError:
        return str(run_dir)


def manifest_of(jobs: list[Job], output_dir: Path) -> dict[str, dict]:
    """Table 1 column -> the run directory (relative to ``output_dir``) and predictor holding it, in the reports'
    order (``swalab.methods.column_rank``), each method's columns by growing budget."""
    pairs = [(column, {"run": relative_to(job.run_dir, output_dir), "predictor": predictor})
             for job in jobs for column, predictor in job.columns.items()]
    return dict(sorted(pairs, key=lambda pair: (column_rank(pair[1]["predictor"]),
                                                float(pair[0].partition(" ")[2].rstrip("B") or 1))))


def run_path(root: Path | None, where: str) -> Path:
    """A run directory named in a row record: relative to the record's output directory (``root``), or absolute
    (records written before runs were stored relative)."""
    path = Path(where)
    return path if path.is_absolute() or root is None else root / path


def row_metrics(manifest: dict[str, dict], root: Path | None = None) -> dict[str, dict]:
    """Table 1 column -> that predictor's metrics (acc, nll, ece, ...) read from its run's metrics.json."""
    out = {}
    for column, where in manifest.items():
        run_dir = run_path(root, where["run"])
        metrics = RunDir(run_dir).final_metrics()
        if metrics is None:
            raise FileNotFoundError(f"{run_dir} has not finished (no metrics.json): run the row's command again")
        out[column] = metrics[where["predictor"]]
    return out


def row_records(roots) -> list[dict]:
    """The records ``python -m swalab.results.row`` wrote (``<output dir>/rows/*.json``) below ``roots``."""
    found = []
    for root in map(Path, roots):
        for path in sorted(root.rglob("rows/*.json")):
            record = read_json(path)
            if isinstance(record, dict) and "jobs" in record and "columns" in record:
                found.append({**record, "root": str(path.parent.parent)})
    unique = {}  # two records of the same runs (renamed records, roots that overlap) are one row
    for record in found:
        runs = tuple(sorted(str(run_path(Path(record["root"]), job["run_dir"]).resolve()) for job in record["jobs"]))
        unique[(record["seed"], bool(record.get("naive")), runs)] = record
    return list(unique.values())


def trained_epochs(run_dir: Path, after: int) -> list[dict]:
    """The history rows of the epochs ``run_dir`` trained itself: those after its branch point ``after``."""
    return [r for r in RunDir(run_dir).history() if int(r.get("epoch", 0)) > after]


def row_cost(record: dict) -> dict | None:
    """What one branched row cost against the naive runs it replaces, from the runs themselves.

    ``epochs`` and ``seconds`` add up, over the row's jobs, the epochs each run trained itself (after its
    branch point) and their times in its ``history.jsonl`` (training, the method's epoch hooks, the test
    pass; start-up and the final scoring are not counted). The runs' own records make the figure the same
    however many launches the row took and whichever were killed. The naive estimate trains every column
    straight through (its epochs from the column's predictor in ``metrics.json``) at the row's mean seconds
    per epoch. None when a column's run is missing or the row trained nothing."""
    root = Path(record["root"]) if record.get("root") else None
    epochs, seconds = 0, 0.0
    for job in record["jobs"]:
        rows = trained_epochs(run_path(root, job["run_dir"]), int(job.get("branch_epoch") or 0))
        epochs += len(rows)
        seconds += sum(float(r.get("seconds", 0.0)) for r in rows)
    try:
        naive = sum(int(m["epoch"]) for m in row_metrics(record["columns"], root).values())
    except (OSError, ValueError, KeyError):
        return None
    if not epochs or not seconds:
        return None
    return {"seed": record["seed"], "seconds": seconds, "epochs": epochs, "naive_epochs": naive,
            "naive_seconds": seconds / epochs * naive, "naive": bool(record.get("naive"))}


def format_row(metrics: dict[str, dict]) -> str:
    """The row as a small table: one line per column, in the paper's order, with accuracy, NLL and ECE."""
    width = max([len("column"), *map(len, metrics)])  # the widest column name ("SWAG-diag 1.5B") sets the width
    lines = [f"{'column':<{width}} {'epochs':>6} {'acc %':>7} {'nll':>7} {'ece':>7}"]
    for column, m in metrics.items():
        lines.append(f"{column:<{width}} {m.get('epoch', ''):>6} {m['acc']:7.2f} {m['nll']:7.4f} {m['ece']:7.4f}")
    return "\n".join(lines)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra ``key=value`` overrides from the row's own ``--options``."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    return [a for a in argv if a not in overrides], overrides


def main(argv: list[str] | None = None) -> dict:
    own, extra = split_args(list(sys.argv[1:] if argv is None else argv))
    parser = argparse.ArgumentParser(
        prog="python -m swalab.results.row", description=described(__doc__),
        epilog="Any other argument of the form key=value is a Hydra override handed to every run of the row, "
               "e.g. dataset.root=../shared/data/cifar10-jpg dataset.train_size=10000 model.budget_epochs=30 "
               "logger=none paths.output_dir=<dir>.")
    parser.add_argument("--dataset", required=True, help="the data set, as dataset= names it (conf/dataset/)")
    parser.add_argument("--model", required=True, help="the model, as model= names it (conf/model/)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one row per seed (default: 0)")
    parser.add_argument("--swa-budgets", type=float, nargs="+", default=list(SWA_BUDGETS),
                        help="the SWA columns, in budgets B (default: %(default)s)")
    parser.add_argument("--no-fge", action="store_true", help="leave out the FGE column")
    parser.add_argument("--naive", action="store_true", help="train each column straight through (no branching)")
    parser.add_argument("--ema", action="store_true", help="add an EMA run of one budget (trained straight through)")
    parser.add_argument("--method", action="append", default=[], metavar="NAME",
                        help="add a run of method=NAME (a method of one's own too): its columns after SWA's")
    parser.add_argument("--swag", action="store_true",
                        help="train the largest SWA budget as SWAG (method=swag): SWA's columns and SWAG's from one run")
    parser.add_argument("--dry-run", action="store_true", help="print the commands in order and run nothing")
    args = parser.parse_args(own)
    bad = [b for b in args.swa_budgets if not (math.isfinite(b) and b > 0)]
    if bad:
        raise ConfigError(f"--swa-budgets {' '.join(f'{b:g}' for b in bad)}: every SWA budget must be a number > 0 "
                          "(the paper's are 1 1.25 1.5)")
    try:
        return run_rows(args, extra)
    except RowError as exc:
        print(f"[row] {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def run_rows(args: argparse.Namespace, extra: list[str]) -> dict:
    result = {}
    for seed in args.seeds:
        methods = [*(() if args.no_fge else ("fge",)), *(("ema",) if args.ema else ()), *args.method]
        jobs = plan_row(args.dataset, args.model, seed, extra, args.swa_budgets, methods, args.naive, args.swag)
        costs = run_jobs(jobs, dry_run=args.dry_run)
        if args.dry_run:
            continue
        output_dir = Path(str(compose_run([f"dataset={args.dataset}", f"model={args.model}", *extra]).paths.output_dir))
        manifest = manifest_of(jobs, output_dir)
        record = {"dataset": args.dataset, "model": args.model, "seed": seed, "naive": args.naive,
                  "jobs": [{**asdict(j), "run_dir": relative_to(j.run_dir, output_dir)} for j in jobs],
                  "launch": costs, "columns": manifest}
        rest = jobs[0].run_dir.parent.name  # the trunk's config: a row of another config keeps a record of its own
        path = (output_dir / "rows" /
                f"{args.dataset}_{args.model}_{rest}_seed{seed}{'_naive' if args.naive else ''}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(record, indent=2) + "\n")
        print(f"[row] seed {seed}: {path}\n" + format_row(row_metrics(manifest, output_dir)))
        result[seed] = {**record, "root": str(output_dir)}
    return result


if __name__ == "__main__":
    run_command(main, prog="swalab.results.row",
                interrupted="the finished jobs are kept and the running one paused as run.py pauses (a checkpoint "
                            "at its step); the same command continues the row")
