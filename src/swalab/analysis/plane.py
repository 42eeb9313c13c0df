"""Loss and error surfaces in the plane through three weight vectors (paper Figs. 1 and 3).

The basis is the paper's footnote 1: ``u = w2 - w1``, ``v = (w3 - w1) - <w3 - w1, u>/||u||^2 u``,
both normalised; the point ``(x, y)`` is ``w1 + x u_hat + y v_hat``. So ``w1`` sits at the origin,
``w2`` at ``(||u||, 0)`` and ``w3`` at its projections. The grid spans the coordinates of the three
points and of any ``--point`` weights (with ``--span-trajectory`` also the projected trajectory, for
when the iterates travel beyond the three points) plus ``margin`` times that span on every side. Other
weights (a run's saved checkpoints, the SWA solution) are projected into the plane; they generally lie off it, so the surface value under a
projected point is *not* that point's loss (the paper makes the same remark).

Usage (w1, w2, w3 and --point take weight specs, see :mod:`swalab.analysis.loading`)::

    python -m swalab.analysis.plane --w1 RUN@12 --w2 RUN:swa --w3 RUN:sgd --trajectory RUN \\
        --grid 21 --margin 0.2 --train-size 1000 --test-size 1000 --out DIR

Writes ``DIR/plane.jsonl`` (one line per grid point as it is evaluated; a re-run skips those),
``DIR/plane.npz`` (grid, surfaces, projected points) and ``DIR/plane.png``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from swalab.analysis import plots
from swalab.checkpoint import CheckpointStore
from swalab.config import ConfigError
from swalab.analysis.loading import add_common_arguments, flat, open_study
from swalab.analysis.probe import Probe, ResultLog, save_arrays
from swalab.cli import described, run_command
from swalab.runweights import load_weights, run_of

METRICS = ("train_loss", "train_ce", "train_err", "test_loss", "test_err")


class Plane:
    """The affine plane through ``w1, w2, w3`` with the footnote-1 orthonormal basis."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor):
        u = w2 - w1
        du = float(u.norm())
        if du == 0:
            raise ConfigError("--w1 and --w2 are the same weights: they do not define a direction; name other weights")
        d3 = w3 - w1
        v = d3 - (d3 @ u) / (du ** 2) * u
        dv = float(v.norm())
        if dv <= 1e-12 * max(du, float(d3.norm())):
            raise ConfigError("--w1, --w2 and --w3 lie on one line: they do not define a plane; name other weights")
        self.origin, self.u_hat, self.v_hat = w1, u / du, v / dv

    def point(self, x: float, y: float) -> torch.Tensor:
        return self.origin + x * self.u_hat + y * self.v_hat

    def coordinates(self, w: torch.Tensor) -> tuple[float, float, float]:
        """``(x, y, distance off the plane)`` of the orthogonal projection of ``w``."""
        d = w - self.origin
        x, y = float(d @ self.u_hat), float(d @ self.v_hat)
        off = float((d - x * self.u_hat - y * self.v_hat).norm())
        return x, y, off


def grid_axes(coords: list[tuple[float, float]], size: int, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """``size`` points per axis over the span of ``coords`` widened by ``margin`` x span on each side."""
    xy = np.asarray(coords, dtype=float)
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    span = hi - lo
    span = np.where(span > 0, span, span.max())
    lo, hi = lo - margin * span, hi + margin * span
    return np.linspace(lo[0], hi[0], size), np.linspace(lo[1], hi[1], size)


def evaluate_grid(plane: Plane, xs: np.ndarray, ys: np.ndarray, probe: Probe, log: ResultLog,
                  progress: bool = True) -> dict[str, np.ndarray]:
    """Score every grid point not yet in ``log`` (row by row) and return ``{metric: [len(ys), len(xs)]}``."""
    total, done_before, started = len(xs) * len(ys), sum(1 for _ in log.rows), time.time()
    out = {m: np.full((len(ys), len(xs)), np.nan) for m in METRICS}
    for j, y in enumerate(ys):
        for i, x in enumerate(xs):
            key = f"{i},{j}"
            if key not in log:
                metrics = probe(plane.point(float(x), float(y)))
                log.add(key, {"i": i, "j": j, "x": float(x), "y": float(y), **metrics})
                if progress:
                    n = probe.calls
                    eta = (time.time() - started) / n * (total - done_before - n)
                    print(f"[plane] {len(log.rows)}/{total} ({x:+.3f}, {y:+.3f}) train_loss "
                          f"{metrics['train_loss']:.4f} test_err {metrics['test_err']:.2f}%  eta {eta:.0f}s",
                          flush=True)
            row = log.rows[key]
            for m in METRICS:
                out[m][j, i] = row[m]
    return out


def trajectory_specs(run_dir: str | Path) -> list[tuple[int, str]]:
    """``(epoch, path)`` of every checkpoint a run kept (``checkpoints/`` and ``checkpoints/saved/``)."""
    kept = [(epoch, str(path)) for epoch, path in CheckpointStore(run_dir).kept()]
    if not kept:
        raise FileNotFoundError(f"--trajectory {run_dir}: no checkpoints/epochNNNN.pt there")
    return kept


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m swalab.analysis.plane", description=described(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--w1", required=True, help="weights at the origin: <ckpt|run[:swa|:sgd|@epoch]>")
    p.add_argument("--w2", required=True, help="weights on the x axis")
    p.add_argument("--w3", required=True, help="third weights, fixing the y direction")
    p.add_argument("--labels", nargs=3, default=None, metavar=("L1", "L2", "L3"),
                   help="names for w1 w2 w3 on the plot (default: the specs' last parts)")
    p.add_argument("--trajectory", default=None, help="a run directory whose checkpoints are projected and drawn")
    p.add_argument("--point", action="append", default=[], metavar="NAME=SPEC",
                   help="another weight vector to project and mark (repeatable)")
    p.add_argument("--run", default=None, help="run directory for the config and data (default: the one w1 is in)")
    p.add_argument("--grid", type=int, default=21, help="grid points per axis")
    p.add_argument("--margin", type=float, default=0.2, help="margin on every side, as a fraction of the span")
    p.add_argument("--span-trajectory", action="store_true",
                   help="widen the grid to cover the projected trajectory too (default: the marked points only)")
    add_common_arguments(p)
    args = p.parse_args(argv)
    if args.grid < 2:
        p.error(f"--grid {args.grid}: a surface needs at least 2 points per axis")
    for item in args.point:
        if not item.partition("=")[2]:
            p.error(f"--point {item}: give NAME=SPEC, e.g. --point SWA=<run dir>:swa")
    return args


def _label(spec: str) -> str:
    return Path(str(spec).rstrip("/")).name


def main(argv=None) -> dict:
    args = parse_args(argv)
    run_dir = args.run or run_of(args.w1)
    if run_dir is None:
        sys.exit("--run is needed: w1 is not inside a run directory, so its config and data are unknown")
    study = open_study(run_dir, args)
    space = study.space
    states = [load_weights(s) for s in (args.w1, args.w2, args.w3)]
    network = f"--run {run_dir}" if args.run else f"{run_dir} (the run of --w1)"
    w = [flat(space, state, f"--w{i} {spec}", network)
         for i, (state, spec) in enumerate(zip(states, (args.w1, args.w2, args.w3)), 1)]
    plane = Plane(*w)
    labels = args.labels or [_label(s) for s in (args.w1, args.w2, args.w3)]
    points = {name: plane.coordinates(v) for name, v in zip(labels, w)}
    for item in args.point:
        name, _, spec = item.partition("=")
        points[name] = plane.coordinates(flat(space, load_weights(spec), f"--point {item}", network))
    trajectory = []
    if args.trajectory:
        trajectory = [(epoch, plane.coordinates(flat(space, load_weights(p), f"--trajectory {p}", network)))
                      for epoch, p in trajectory_specs(args.trajectory)]
    spanned = list(points.values()) + ([c for _, c in trajectory] if args.span_trajectory else [])
    xs, ys = grid_axes([(x, y) for x, y, _ in spanned], args.grid, args.margin)

    out = Path(args.out)
    weights = dict(w1=args.w1, w2=args.w2, w3=args.w3)
    extent = dict(x=[float(xs[0]), float(xs[-1])], y=[float(ys[0]), float(ys[-1])])
    log = ResultLog(out / "plane.jsonl", study.settings(weights, out, grid=args.grid, margin=args.margin, **extent))
    probe = study.probe(space.buffers(states[0]))
    surfaces = evaluate_grid(plane, xs, ys, probe, log, progress=not args.quiet)

    names = list(points)
    traj_xy = np.array([[x, y] for _, (x, y, _) in trajectory]).reshape(-1, 2)
    save_arrays(out / "plane.npz", xs=xs, ys=ys, **surfaces, point_names=np.array(names),
             point_xyz=np.array([points[n] for n in names]), trajectory_epochs=np.array([e for e, _ in trajectory]),
             trajectory_xyz=np.array([c for _, c in trajectory]).reshape(-1, 3))
    title = study.describe()
    plots.plane_figure(out / "plane.png", xs, ys,
                       {"train loss (CE + L2)": surfaces["train_loss"], "test error (%)": surfaces["test_err"]},
                       {n: points[n][:2] for n in names},
                       {"trajectory": traj_xy} if len(traj_xy) else None, title=title)
    print(f"[plane] wrote {out / 'plane.npz'} and {out / 'plane.png'} ({probe.calls} points evaluated now)")
    return {"surfaces": surfaces, "xs": xs, "ys": ys, "points": points, "trajectory": trajectory,
            "evaluated": probe.calls}


if __name__ == "__main__":
    run_command(main, prog="swalab.analysis")
