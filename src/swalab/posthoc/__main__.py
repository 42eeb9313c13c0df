"""``python -m swalab.posthoc <run dir>... [options]``: the command of ``swalab.posthoc`` (its module doc)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from swalab.cli import each_once, output_file, run_command
from swalab.identity import label_of
from swalab.posthoc import FOLDER, PosthocError, Request, build_and_score, earlier_results, select
from swalab.posthoc.figure import ONLINE, plot
from swalab.results.compare import finished_run
from swalab.results.runs import Run
from swalab.runlock import held_folders


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m swalab.posthoc",
                                description="Averages built after training from snapshots (docs/posthoc.md).")
    p.add_argument("runs", nargs="+", help="run directories (finished; written with run.snapshots for SWA/LAWA/EMA)")
    p.add_argument("--swa", nargs="+", default=[], metavar="A:B", help="SWA over epochs A to B (A: to the end)")
    p.add_argument("--lawa", nargs="+", type=int, default=[], metavar="K", help="the mean of the last K snapshots")
    p.add_argument("--ema", nargs="+", type=float, default=[], metavar="DECAY", help="EMA over snapshots, per snapshot")
    p.add_argument("--powerema", nargs="+", type=float, default=[], metavar="SIGMA_REL",
                   help="EDM2's power EMA of this relative width, rebuilt from the run's run.powerema snapshots")
    p.add_argument("--soup", nargs="+", default=[], choices=["uniform", "greedy"],
                   help="soups of the runs' final weights (one config, other seeds); greedy by validation score")
    p.add_argument("--wiseft", nargs="+", type=float, default=[], metavar="ALPHA",
                   help="(1 - ALPHA) start + ALPHA final, for runs started from weights (model.init_from or timm "
                        "pretrained)")
    p.add_argument("--wiseft-bn", nargs="+", default=["recompute"], choices=["recompute", "interpolate"],
                   help="WiSE-FT's BatchNorm statistics: recompute (over the training data, default; alpha 0 is then "
                        "not the start network) and/or interpolate (as the weights: alpha 0 and 1 are the start and "
                        "the final networks), labelled wiseftA[bn-interp]")
    p.add_argument("--select", default=None, help="val: name the best of each family on the validation split")
    p.add_argument("--by", default="nll", help="what --select and the greedy soup rank by: nll (default) or acc")
    p.add_argument("--mark", nargs="+", default=[], metavar="RUN",
                   help="runs whose online SGD / SWA / EMA (or pretrained, of a method=pretrained run) the "
                        "figure marks (default: the runs given)")
    p.add_argument("--figure", default=None, help=f"the figure's file (default: <first run>/{FOLDER}/posthoc.png)")
    p.add_argument("--again", action="store_true",
                   help="build every average again, even one an earlier call built from the same files")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    return p


def online_of(run_dirs: Sequence[str]) -> dict[str, dict]:
    """``{"swa (swa run, seed 0)": metrics}``: the online SGD, SWA and EMA predictors the runs scored (their
    metrics.json), and the pretrained weights a ``method=pretrained`` run scored; two runs of one method and seed
    (a fine-tune and its start) named by what sets them apart (:func:`told_apart`)."""
    runs = [Run(d) for d in each_once(run_dirs)]
    out = {}
    for run in runs:
        apart = told_apart(run, runs)
        for name in ONLINE:
            if name in run.metrics and (name != "sgd" or run.method == "sgd"):  # a SWA run's sgd is its last iterate
                out[f"{name} ({run.method} run, seed {run.seed}{apart})"] = run.metrics[name]
    return out


def told_apart(run: Run, runs: Sequence[Run]) -> str:
    """``, model.lr=0.01``: the settings (as typed) that set ``run`` apart from the other ``runs`` of its method and
    seed, so that no two marks of the figure read alike; empty when no other is of its method and seed."""
    twins = [other for other in runs if other is not run and (other.method, other.seed) == (run.method, run.seed)]
    if not twins:
        return ""
    mine = run.apart or {}
    differing = ({k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k)}
                 for theirs in (other.apart or {} for other in twins))
    keys = sorted(set().union(*differing))
    if not keys:  # one config in two output folders
        return f", {run.path}"
    set_here = [k for k in keys if k in mine]
    at_defaults = [k for k in keys if k not in mine]
    return ", " + ", ".join([*([label_of(mine, set_here)] if set_here else []),
                             *([f"{', '.join(at_defaults)} at the defaults"] if at_defaults else [])])


def check_marks(run_dirs: Sequence[str]) -> None:
    """Refuse, before anything is built, a ``--mark`` the figure could not draw (no run there, one not finished, one
    that scored none of :data:`ONLINE`): it drew no line for it, and said nothing."""
    for run_dir in run_dirs:
        try:
            finished_run(run_dir)
        except FileNotFoundError as exc:
            raise PosthocError(f"--mark: {exc}") from None
        if not online_of([run_dir]):
            raise PosthocError(f"--mark: {run_dir} scored none of the predictors the figure marks "
                               f"({', '.join(ONLINE)}: an SGD, SWA, EMA or pretrained run's); leave it out")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    request = Request(swa=args.swa, lawa=args.lawa, ema=args.ema, powerema=args.powerema, soup=args.soup,
                      wiseft=args.wiseft, wiseft_bn=args.wiseft_bn, select=args.select, by=args.by, again=args.again)
    if not any((request.swa, request.lawa, request.ema, request.powerema, request.soup, request.wiseft)):
        print("[swalab.posthoc] nothing asked: give --swa, --lawa, --ema, --powerema, --soup or --wiseft",
              file=sys.stderr)
        return 2
    for run_dir in args.runs:  # every run checked before its posthoc/ is locked (and made)
        finished_run(run_dir)
    figure = output_file(args.figure or Path(args.runs[0]) / FOLDER / "posthoc.png", "--figure")
    check_marks(args.mark)
    with held_folders([Path(run_dir) / FOLDER for run_dir in each_once(args.runs)], "averaged"):
        return build_score_and_draw(args, request, figure)


def build_score_and_draw(args: argparse.Namespace, request: Request, figure: Path) -> int:
    """Build and score the averages asked, choose on validation, draw the figure (:func:`main`'s work, with every
    run's ``posthoc/`` held)."""
    results = build_and_score(args.runs, request, device=args.device)
    for run_dir in each_once(args.runs):
        for line in Run(run_dir).posthoc_notes():  # earlier averages the run's files no longer match
            print(f"[swalab.posthoc] {line}")
    earlier = earlier_results(results)  # still current: drawn beside this call's, and compared by --select
    chosen = select([*results, *earlier], request.by) if args.select else {}  # every family the figure draws
    if args.select:
        for (run, family), best in chosen.items():
            val = best.metrics[best.label]["val"]
            print(f"[swalab.posthoc] chosen on validation {request.by}: {best.label} (val acc {val['acc']:.2f}, nll "
                  f"{val['nll']:.4f}) of {family} for {run}" + (", built by an earlier call" if best in earlier else ""))
    first = Run(args.runs[0])
    title = f"post-hoc averages of {first.dataset_name} / {first.model_name} / {first.method}, seed {first.seed}"
    drawn = [*results, *(e for e in earlier if not math.isnan(e.knob))]  # every average of the runs' posthoc/
    if plot(drawn, online_of(args.mark or args.runs), figure, title=title,
            chosen=[best.label for best in chosen.values()]):
        print(f"[swalab.posthoc] figure: {figure}")
    return 0


if __name__ == "__main__":
    # every average written before is whole, the one being written has no record
    sys.exit(run_command(main, prog="swalab.posthoc",
                         interrupted="each average's record is whole (this call's or an earlier one's) or absent; the "
                                     "same command builds the averages asked again"))
