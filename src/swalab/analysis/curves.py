"""Test error against epoch for several runs, from their ``history.jsonl`` (paper Figs. 6 and 7).

For each run the live model's curve comes from ``test_acc`` (labelled ``<name>: SGD iterate``) and, where the
run logged it (SWA with ``model.swa.score_every=1``), the average's curve from ``swa_test_acc``
(``<name>: SWA average``). A SWA run that did not score its average says so in one line, naming the setting
that scores it: its iterate is drawn alone, or with ``--only swa`` nothing of it; ``--only swa`` over runs of
which none scored it is that one line as an error, and nothing is written. Errors are ``100 - accuracy``.

Usage::

    python -m swalab.analysis.curves RUN [RUN ...] [--labels A B ...] [--only swa|sgd] --out fig.png"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from matplotlib.backend_bases import FigureCanvasBase

from swalab.analysis import plots
from swalab.cli import described, output_file, run_command
from swalab.config import ConfigError
from swalab.rundir import RunDir


#: how a SWA run has its average scored during training, said wherever a run did not
SCORE_EVERY = "model.swa.score_every=N scores it every N epochs"


def read_history(run_dir: str | Path) -> list[dict]:
    if not (Path(run_dir) / RunDir.HISTORY).exists():
        raise FileNotFoundError(f"{run_dir} has no history.jsonl")
    return RunDir(run_dir).history()


def error_curves(history: list[dict], label: str, only: str | None = None) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``[(label, epochs, test error %)]``: the SGD curve (``test_acc``) and the SWA one (``swa_test_acc``)."""
    curves = []
    for key, kind, name in (("test_acc", "SGD", plots.SGD_ITERATE), ("swa_test_acc", "SWA", "SWA average")):
        if only and only.upper() != kind:
            continue
        rows = [r for r in history if r.get(key) is not None]
        if rows:
            curves.append((f"{label}: {name}", np.array([r["epoch"] for r in rows]),
                           100.0 - np.array([r[key] for r in rows], dtype=float)))
    return curves


def _method(run_dir: str | Path) -> str | None:
    from swalab.results.runs import Run

    return Run(run_dir).get("method.name")


def label_of(run_dir: str | Path) -> str:
    """A short name: the run directory's path below its ``seedN`` folder's grandparent, if any."""
    parts = Path(run_dir).resolve().parts
    return "/".join(parts[-3:-1]) if parts[-1].startswith("seed") and len(parts) >= 3 else parts[-1]


def main(argv=None) -> list:
    p = argparse.ArgumentParser(prog="python -m swalab.analysis.curves", description=described(__doc__))
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--labels", nargs="+", default=None, help="one label per run (default: from the paths)")
    p.add_argument("--only", choices=["swa", "sgd"], default=None, help="draw only the SWA or only the SGD curves")
    p.add_argument("--title", default="", help="figure title")
    p.add_argument("--out", required=True, help="the figure to write, its format by its suffix (fig.png, fig.pdf)")
    args = p.parse_args(argv)
    output_file(args.out, "--out")  # checked before any work, as every tool checks where it writes
    if Path(args.out).suffix[1:].lower() not in FigureCanvasBase.get_supported_filetypes():
        raise ConfigError(f"--out {args.out}: its suffix names no figure format; end it in .png (or .pdf, .svg), "
                          f"e.g. --out {Path(args.out).with_suffix('.png')}")
    if args.labels and len(args.labels) != len(args.runs):
        p.error(f"--labels needs one label per run ({len(args.runs)}), got {len(args.labels)}")
    labels = args.labels or [label_of(r) for r in args.runs]
    histories = [read_history(run) for run in args.runs]
    unscored = [run for run, h in zip(args.runs, histories)
                if _method(run) == "swa" and not any(r.get("swa_test_acc") is not None for r in h)]
    curves = [c for h, label in zip(histories, labels) for c in error_curves(h, label, args.only)]
    if not curves:
        if args.only == "swa" and unscored:
            which = (f"{unscored[0]} did not score its SWA average" if len(unscored) == 1
                     else f"none of the {len(unscored)} SWA runs scored its average")
            raise FileNotFoundError(f"{which} during training ({SCORE_EVERY}): nothing to draw with --only swa")
        what = {"swa": f"swa_test_acc (the SWA average scored during training: {SCORE_EVERY})",
                "sgd": "test_acc (run.eval_every=1)"}.get(args.only, "test_acc or swa_test_acc")
        raise FileNotFoundError(f"none of the runs logged {what}: nothing to draw")
    drawn = "it has no curve here" if args.only == "swa" else "only its SGD iterate is drawn"
    for run in unscored if args.only != "sgd" else ():
        print(f"[curves] {run} did not score its SWA average during training ({SCORE_EVERY}): {drawn}")
    plots.curves_figure(args.out, curves, title=args.title)
    print(f"[curves] wrote {args.out} ({len(curves)} curves)")
    return curves


if __name__ == "__main__":
    run_command(main, prog="swalab.analysis")
