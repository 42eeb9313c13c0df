"""Width along random directions: train loss and test error on rays from SWA and SGD (paper Fig. 4).

For unit directions ``d_i`` drawn uniformly from the sphere in parameter space (the same ``d_i``
for both starts), score ``w_SWA + t d_i`` and ``w_SGD + t d_i`` for ``t`` from 0 to
``--max-distance``. A wider solution is one whose curves rise later. ``t = 0`` is the solution
itself, scored once per start.

Usage::

    python -m swalab.analysis.rays --run RUN --directions 10 --max-distance 20 --points 11 \\
        --train-size 1000 --test-size 1000 --out DIR

``--swa`` / ``--sgd`` take other weight specs (e.g. ``--sgd OTHER_RUN`` for a conventionally
trained SGD run, as in the paper; by default both come from the SWA run's ``final.pt``, where
"sgd" is the last iterate of the SWA phase). Writes ``DIR/rays.jsonl`` (resumable), ``DIR/rays.npz``
and ``DIR/rays.png``."""

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
from swalab.analysis.weights import random_unit_directions
from swalab.cli import described, run_command


def evaluate_rays(starts: dict[str, tuple], directions, distances: np.ndarray, probe: Probe, log: ResultLog,
                  progress: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """``{start: {metric: [directions, len(distances)]}}`` for ``starts = {name: (vector, buffers)}``."""
    out: dict[str, dict[str, np.ndarray]] = {}
    started = time.time()
    for name, (w, buffers) in starts.items():
        out[name] = {m: np.full((len(directions), len(distances)), np.nan) for m in METRICS}
        for k, t in enumerate(distances):
            for i, d in enumerate(directions):
                key = f"{name}/0" if t == 0 else f"{name}/{i}/{k}"  # t = 0 is the same point for every d
                if key not in log:
                    metrics = probe(w + float(t) * d, buffers)
                    log.add(key, {"start": name, "direction": i, "t": float(t), **metrics})
                    if progress:
                        print(f"[rays] {name} d{i} t={t:.3g}: train_loss {metrics['train_loss']:.4f} "
                              f"test_err {metrics['test_err']:.2f}%  ({time.time() - started:.0f}s)", flush=True)
                for m in METRICS:
                    out[name][m][i, k] = log.rows[key][m]
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m swalab.analysis.rays", description=described(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_solution_arguments(p)
    p.add_argument("--directions", type=int, default=10, help="number of random unit directions")
    p.add_argument("--max-distance", type=float, default=None,
                   help="largest t (default: 0.5 x ||w_SWA||)")
    p.add_argument("--points", type=int, default=11, help="distances from 0 to --max-distance")
    add_common_arguments(p)
    args = p.parse_args(argv)
    if args.directions < 1 or args.points < 2:
        p.error(f"--directions {args.directions} --points {args.points}: a ray needs at least 1 direction and 2 points")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    study = open_study(args.run, args)
    specs, starts = load_solutions(args, study.space)
    max_distance = args.max_distance if args.max_distance is not None else 0.5 * float(starts["swa"][0].norm())
    distances = np.linspace(0.0, max_distance, args.points)
    directions = random_unit_directions(study.space.dim, args.directions, args.seed)

    out = Path(args.out)
    log = ResultLog(out / "rays.jsonl", study.settings(specs, out, directions=args.directions,
                                                        max_distance=max_distance, points=args.points))
    probe = study.probe(starts["swa"][1])
    curves = evaluate_rays(starts, directions, distances, probe, log, progress=not args.quiet)
    save_arrays(out / "rays.npz", distances=distances,
             **{f"{name}_{m}": curves[name][m] for name in curves for m in METRICS})
    title = f"{study.describe()}: {args.directions} random directions"
    plots.rays_figure(out / "rays.png", distances, curves, title=title, names=solution_names(args))
    print(f"[rays] wrote {out / 'rays.npz'} and {out / 'rays.png'} ({probe.calls} points evaluated now)")
    return {"distances": distances, "curves": curves, "evaluated": probe.calls}


if __name__ == "__main__":
    run_command(main, prog="swalab.analysis")
