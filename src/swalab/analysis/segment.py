"""The line through SWA and SGD: ``w(t) = t w_SGD + (1 - t) w_SWA``, beyond both ends (paper Fig. 5).

Train loss and test error are plotted against the signed distance from SWA, ``t ||w_SGD - w_SWA||``:
SWA at 0, SGD at ``||w_SGD - w_SWA||``, negative values on the far side of SWA. The paper reads two
things off this plot: the train-loss and test-error curves are shifted against each other, and SGD
sits near the edge of a flat region of the train loss, where it rises steeply.

Usage::

    python -m swalab.analysis.segment --run RUN --t-min -1 --t-max 2 --points 31 \\
        --train-size 1000 --test-size 1000 --out DIR

Writes ``DIR/segment.jsonl`` (resumable), ``DIR/segment.npz`` and ``DIR/segment.png``. Without
``--bn-update`` each point keeps the BN statistics of the nearer end (SWA for t < 0.5)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from swalab.analysis import plots
from swalab.analysis.loading import (add_common_arguments, add_solution_arguments, load_solutions, open_study,
                                     solution_names)
from swalab.analysis.plane import METRICS
from swalab.analysis.probe import Probe, ResultLog, save_arrays
from swalab.cli import described, run_command


def segment_ts(t_min: float, t_max: float, points: int) -> np.ndarray:
    """``points`` evenly spaced values of t, plus exactly 0 (SWA) and 1 (SGD) when in range."""
    ts = np.linspace(t_min, t_max, points)
    extra = [t for t in (0.0, 1.0) if t_min <= t <= t_max]
    return np.unique(np.round(np.concatenate([ts, extra]), 12))


def evaluate_segment(swa: tuple, sgd: tuple, ts: np.ndarray, probe: Probe, log: ResultLog,
                     progress: bool = True) -> dict[str, np.ndarray]:
    """``{metric: [len(ts)]}`` along ``w(t)``; ``swa`` and ``sgd`` are ``(vector, buffers)``."""
    (w_swa, b_swa), (w_sgd, b_sgd) = swa, sgd
    out = {m: np.full(len(ts), np.nan) for m in METRICS}
    started = time.time()
    for k, t in enumerate(ts):
        key = f"{t:.12g}"
        if key not in log:
            metrics = probe(float(t) * w_sgd + (1.0 - float(t)) * w_swa, b_swa if t < 0.5 else b_sgd)
            log.add(key, {"t": float(t), **metrics})
            if progress:
                print(f"[segment] t={t:+.3f}: train_loss {metrics['train_loss']:.4f} test_err "
                      f"{metrics['test_err']:.2f}%  ({time.time() - started:.0f}s)", flush=True)
        for m in METRICS:
            out[m][k] = log.rows[key][m]
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m swalab.analysis.segment", description=described(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_solution_arguments(p)
    p.add_argument("--t-min", type=float, default=-1.0, help="smallest t (negative: beyond SWA)")
    p.add_argument("--t-max", type=float, default=2.0, help="largest t (above 1: beyond SGD)")
    p.add_argument("--points", type=int, default=31, help="evenly spaced values of t (0 and 1 are added)")
    add_common_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    study = open_study(args.run, args)
    specs, solutions = load_solutions(args, study.space)
    swa, sgd = solutions["swa"], solutions["sgd"]
    length = float((sgd[0] - swa[0]).norm())
    ts = segment_ts(args.t_min, args.t_max, args.points)

    out = Path(args.out)
    log = ResultLog(out / "segment.jsonl", study.settings(specs, out, t_min=args.t_min, t_max=args.t_max,
                                                          points=args.points))
    probe = study.probe(swa[1])
    values = evaluate_segment(swa, sgd, ts, probe, log, progress=not args.quiet)
    distances = ts * length
    save_arrays(out / "segment.npz", t=ts, distance=distances, sgd_distance=length, **values)
    names = solution_names(args)
    title = study.describe().replace(" (", f": {names['swa']} to {names['sgd']}\n(", 1)
    plots.segment_figure(out / "segment.png", distances, values["train_loss"], values["test_err"], length,
                         title=title, names=(names["swa"], names["sgd"]))
    print(f"[segment] ||w_SGD - w_SWA|| = {length:.4f}; wrote {out / 'segment.npz'} and {out / 'segment.png'} "
          f"({probe.calls} points evaluated now)")
    return {"t": ts, "distance": distances, "length": length, "values": values, "evaluated": probe.calls}


if __name__ == "__main__":
    run_command(main, prog="swalab.analysis")
