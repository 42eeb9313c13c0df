"""Paper-style tables and plots from finished runs: ``python -m swalab.results.report <dir> [<dir> ...]``.

Use it after a grid (``python run.py -m ...``) or on any tree of run directories, or on the grid
records in ``outputs/grids/<date_time>/`` (then exactly that grid's runs are read). It reads only the
files each run wrote (``config.yaml``/``identity.json``, ``status.json``, ``metrics.json``,
``history.jsonl``, ``reliability.json``, ``lineage.json``, ``scores/``), never the weights, so it takes
seconds.

How runs become a table that never mixes or double-counts them: ``swalab.results.table``. The
pieces: ``runs`` (reading run directories), ``table`` (cells, rows, columns), ``write`` (table.md and
the CSVs), ``plots``, ``shift_plots`` (the runs scored under shift), ``diagnostics`` (section 3.5),
``wandb_report`` (the W&B Report).

Writes to ``--out`` (default ``report/``):

    table.md          accuracy, NLL, ECE and Brier tables (mean ± std over seeds, n), paired differences
                      against SGD per seed, every column of a row on a line of its own (with +ts columns or
                      ensembles of seeds: the fitted temperatures, paired differences in NLL too), the
                      ensembles of each config's seeds (deep ensembles, MultiSWAG: swalab.results.ensembles),
                      section 3.5 (SWA against the FGE ensemble), the wall time of branched rows against
                      naive runs (their records in rows/), the runs not in the table (failed, unfinished,
                      duplicates)
    table.csv         one line per (row, column, metric): mean, std, n, the values and their seeds; and per
                      ensemble of seeds
    runs.csv          one line per run: where it is, its state, every predictor's accuracy
    test_error.png    test error against epoch per column: the model it scores where scored during training (SWA's
                      average with model.swa.score_every), the iterate a method trains dashed; band over seeds
    fge_curve.png     FGE ensemble accuracy against the number of members, SWA as a line
    reliability.png   reliability diagrams per column (ECE and Brier in the legend), with the share of images
                      per confidence bin beneath; ``--reliability sgd swa swag fge`` chooses the columns
    shift_corruptions.png  runs scored under corruption (python -m swalab.results.score --data cifar10c:...):
                      accuracy and ECE against severity per column, a box over the corruptions at each severity
                      (swalab.results.shift_plots)
    ood_roc.png       runs scored against OOD sets (--ood): ROC curves per OOD set, a curve per column and score,
                      AUROC in the legend (``--roc-scores``: which scores); an OOD record without per-image
                      scores draws none (a note says so)
    *.pdf             each figure as PDF too

``--paper`` prints the paper's Table 1/2 numbers beside ours; ``--wandb`` also builds a W&B Report
(``swalab.results.wandb_report``: numeric Table 1, test error against epoch, the FGE curve with SWA, each panel
linked to its training runs), saved online with ``--wandb-mode online``, else written as a spec
(``wandb_report.json``) with the one command that publishes it later."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from swalab.cli import described, output_folder, run_command, sigterm_raises
from swalab.results.ensembles import seed_ensembles
from swalab.results.plots import plot_fge_curve, plot_reliability, plot_test_error
from swalab.results.row import row_cost, row_records
from swalab.results.runs import Run, run_dirs
from swalab.results.shift_summary import corruption_markdown, ood_markdown
from swalab.results.shift_plots import DEFAULT_ROC_SCORES, ROC_SCORES, plot_ood_roc, plot_shift_corruptions, roc_missing
from swalab.results.table import Table, build_table
from swalab.results.write import load_paper_tables, other_data_markdown, to_markdown, write_csv, write_runs_csv
from swalab.runlock import process_exists


def problems_of(runs: Sequence[Run], table: Table) -> list[str]:
    """Plain-language notes about what the input holds that the table cannot show."""
    notes = []
    for r in runs:
        if not r.finished:
            why = f": {r.error.splitlines()[0]}" if r.error else ""
            notes.append(f"{r.status}: {r.path}{why}")
        elif not r.config:
            notes.append(f"damaged: {r.path}: config.yaml is missing or holds no config, so the run is in no row of "
                         "the table")
        else:
            notes += r.posthoc_notes()  # averages built after training that no longer match the run's files
            notes += r.score_notes()  # sets scored from files of the run that changed since
    notes += table.duplicates
    datasets = sorted({r.dataset_name for r in runs if r.finished})
    if len(datasets) > 1:
        notes.insert(0, f"the runs mix {len(datasets)} datasets ({', '.join(datasets)}): "
                        "one table per dataset and model, never averaged across datasets")
    return notes


# Every file a report writes into ``--out`` (W&B's spec: ``swalab.results.wandb_report.SPEC_FILE``).
REPORT_FILES = ("table.md", "table.csv", "runs.csv", "test_error.png", "fge_curve.png", "reliability.png",
                "shift_corruptions.png", "ood_roc.png", "test_error.pdf", "fge_curve.pdf", "reliability.pdf",
                "shift_corruptions.pdf", "ood_roc.pdf", "wandb_report.json")


def write_report(work: Path, roots: Sequence[str | Path], runs, table: Table, notes: list[str],
                 costs: list[dict], paper: bool, ensembles: Sequence = (),
                 reliability: Sequence[str] | None = None, roc_scores: Sequence[str] = DEFAULT_ROC_SCORES) -> dict:
    """Write every file of the report of ``runs`` (some of them finished) but W&B's into ``work``; return their
    names."""
    other = [*corruption_markdown(table), *ood_markdown(table), *other_data_markdown(table)]
    (work / "table.md").write_text(to_markdown(table, load_paper_tables() if paper else None, costs, ensembles)
                                   + ("\n" + "\n".join(other) if other else "")
                                   + ("\n## Not in the table\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
                                      if notes else ""))
    write_csv(table, work / "table.csv", ensembles)
    write_runs_csv(runs, work / "runs.csv", roots)
    names: dict = {"table.md": True, "table.csv": True, "runs.csv": True}
    for name, plot in (("test_error", plot_test_error), ("fge_curve", plot_fge_curve),
                       ("reliability", lambda t, p: plot_reliability(t, p, reliability)),
                       ("shift_corruptions", plot_shift_corruptions),
                       ("ood_roc", lambda t, p: plot_ood_roc(t, p, roc_scores))):
        if plot(table, work / f"{name}.png"):
            names.update({f"{name}.png": True, f"{name}.pdf": True})
    return names


def remove_abandoned_work(out: Path) -> None:
    """Remove the work folders (``.<out name>.<pid>.<random>`` beside ``out``) of reports whose process is gone: a
    report killed while it was made leaves its own behind. A live report's folder, another process's, stays."""
    for work in out.parent.glob(f".{out.name}.*.*"):
        pid = work.name[len(out.name) + 2:].split(".", 1)[0]
        if work.is_dir() and pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(work, ignore_errors=True)


def publish(work: Path, out: Path, names: dict) -> None:
    """Move the finished report from ``work`` into ``out``, each file with an atomic rename, then remove what an
    earlier report left there that this one did not write (a stale FGE curve would pass for this one's). A report
    killed while it was made leaves the earlier one whole."""
    for name in names:
        os.replace(work / name, out / name)
    for name in REPORT_FILES:
        if name not in names:
            (out / name).unlink(missing_ok=True)


def report(roots: Sequence[str | Path], out: str | Path, paper: bool = False, wandb_mode: str | None = None,
           wandb_project: str | None = None, wandb_entity: str | None = None,
           reliability: Sequence[str] | None = None, roc_scores: Sequence[str] = DEFAULT_ROC_SCORES) -> dict:
    """Collect runs below ``roots``, write the tables, CSVs and plots to ``out``; return what was found.

    ``wandb_mode`` (``online`` | ``offline``) also builds the W&B Report (``swalab.results.wandb_report``); its
    project and entity default to the runs' own. ``reliability`` names the methods whose columns the reliability
    diagrams draw (``swalab.results.plots.reliability_columns``); ``roc_scores`` the OOD scores of the ROC curves
    (``swalab.results.shift_plots``)."""
    out = output_folder(out, "--out")
    missing = [str(r) for r in roots if not Path(r).exists()]
    if missing:
        raise FileNotFoundError(f"no such directory: {', '.join(missing)}")
    runs = [Run(p) for p in run_dirs(roots)]
    costs = [c for c in map(row_cost, row_records(roots)) if c is not None]
    finished = [r for r in runs if r.finished]
    table = build_table(runs)
    ensembles = seed_ensembles(table)
    notes = problems_of(runs, table) + roc_missing(table)
    if reliability and not any(c.method in reliability for c in table.columns):
        notes.append(f"--reliability {' '.join(reliability)}: no column of these methods (the columns: "
                     f"{', '.join(sorted({c.method for c in table.columns}))}); no reliability diagram")
    found = {"runs": runs, "finished": finished, "table": table, "notes": notes, "ensembles": ensembles}
    if not finished:  # nothing to report: an earlier report in ``out`` stays as it was, every file of it
        return {**found, "written": {}, "wandb": None}
    out.mkdir(parents=True, exist_ok=True)
    remove_abandoned_work(out)
    # a SIGTERM (a time limit, kill) exits 143 through the block, so the work folder is still removed
    with sigterm_raises(lambda signum: SystemExit(128 + signum)):
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", dir=out.parent))  # made here, then moved
        try:
            names = write_report(work, roots, runs, table, notes, costs, paper, ensembles, reliability, roc_scores)
            publish(work, out, names)
        except OSError as exc:  # a full disk, a quota: nothing of the earlier report was replaced
            raise OSError(exc.errno, f"cannot write the report into {out} ({exc.strerror or exc}): the earlier "
                                     "report there is left as it was; free space, or give --out a folder "
                                     "elsewhere") from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
    written = {name: out / name for name in names}
    wandb = None
    if wandb_mode:
        from swalab.results.wandb_report import SPEC_FILE, publish_report

        made_by = (f"python -m swalab.results.report {' '.join(map(str, roots))} --out {out}"
                   + (" --paper" if paper else "") + (f" --reliability {' '.join(reliability)}" if reliability else "")
                   + " --wandb")
        wandb = publish_report(table, out, wandb_mode, project=wandb_project, entity=wandb_entity,
                               paper=load_paper_tables(), made_by=made_by)
        if wandb["spec"] is not None:
            written[SPEC_FILE] = wandb["spec"]
    return {**found, "written": written, "wandb": wandb}


def left_as_it_was(out: Path) -> str:
    """What a report with nothing to write says of ``out``: that an earlier report there was kept, if there is one."""
    earlier = [name for name in REPORT_FILES if (out / name).exists()]
    return f"; the earlier report in {out} is left as it was" if earlier else "; no table written"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swalab.results.report", description=described(__doc__))
    parser.add_argument("dirs", nargs="+", help="output directories, run directories or grid records to read")
    parser.add_argument("--out", default="report", help="where the table, CSVs and plots go (default: report/)")
    parser.add_argument("--paper", action="store_true", help="show the paper's numbers (Tables 1 and 2) beside ours")
    parser.add_argument("--reliability", nargs="+", metavar="METHOD", default=None,
                        help="the columns of the reliability diagrams, by method, each at its largest budget, e.g. "
                             "sgd swa swag fge (swa+ts: SWA at its fitted temperature); default: every column but "
                             "the +ts ones")
    parser.add_argument("--roc-scores", nargs="+", metavar="SCORE", default=list(DEFAULT_ROC_SCORES),
                        choices=list(ROC_SCORES),
                        help="the OOD scores of ood_roc.png's curves: msp, entropy, mutual_information (default: msp "
                             "mutual_information, the second where stored: an ensemble's)")
    parser.add_argument("--wandb", action="store_true",
                        help="also build a W&B Report: saved online, else its spec "
                             "is written next to table.md with the command that publishes it")
    parser.add_argument("--wandb-mode", default="offline", choices=["online", "offline"], help="W&B mode (offline)")
    parser.add_argument("--wandb-project", default=None, help="W&B project (default: the runs', else swalab)")
    parser.add_argument("--wandb-entity", default=None, help="W&B entity (default: the runs', else yours)")
    args = parser.parse_args(argv)
    try:
        result = report(args.dirs, args.out, paper=args.paper, wandb_mode=args.wandb_mode if args.wandb else None,
                        wandb_project=args.wandb_project, wandb_entity=args.wandb_entity,
                        reliability=args.reliability, roc_scores=args.roc_scores)
    except ImportError as exc:  # --wandb without wandb-workspaces
        print(f"[swalab.results.report] {exc}", file=sys.stderr)
        return 2
    runs, finished = result["runs"], result["finished"]
    print(f"[swalab.results.report] {len(runs)} run directories, {len(finished)} finished")
    for note in result["notes"]:
        print(f"[swalab.results.report] {note}")
    if not finished:
        print(f"[swalab.results.report] no finished runs (none has a metrics.json that reads back) below "
              f"{', '.join(args.dirs)}: nothing to report{left_as_it_was(Path(args.out))}", file=sys.stderr)
        return 1
    print((Path(args.out) / "table.md").read_text())
    print(f"[swalab.results.report] wrote {', '.join(sorted(result['written']))} to {args.out}")
    published = result["wandb"]
    if published is not None:
        if published["url"]:
            print(f"[swalab.results.report] W&B report: {published['url']}")
        else:
            why = f" (saving it failed: {published['error']})" if published["error"] else ""
            print(f"[swalab.results.report] W&B report written offline to {published['spec']}{why}; publish it with:\n"
                  f"  {published['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, prog="swalab.results.report",
                         interrupted="the report's files written so far are whole, the rest are missing; the same "
                                     "command again writes it whole"))
