"""PNG figures for the analyses, drawn with matplotlib's Agg backend (no display, no LaTeX).

Each function takes plain arrays (as stored in the analyses' ``.npz`` files), so a figure can be
redrawn from saved data without evaluating anything again. SWA and SGD have the colours they have in the report's
figures (``swalab.style``), and epochs are whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from swalab import style
from swalab.rundir import atomic_write

plt = style.pyplot()  # Agg, no LaTeX: the one style of every swalab figure (swalab.style)

from mpl_toolkits.axes_grid1 import make_axes_locatable  # noqa: E402


#: label suffix of a live-model (SGD iterate) curve; ``curves_figure`` draws those dashed
SGD_ITERATE = "SGD iterate"


def _levels(values: np.ndarray, count: int = 20) -> np.ndarray:
    """Contour levels at quantiles of the finite values, so low basins and steep walls both show."""
    finite = values[np.isfinite(values)]
    levels = np.unique(np.quantile(finite, np.linspace(0, 1, count)))
    return levels if len(levels) > 1 else np.array([finite.min(), finite.min() + 1e-9])


def _digits(values: np.ndarray) -> str:
    """``%.Ng`` with enough digits to tell neighbouring ``values`` apart: a loss of 3639.45 .. 3639.73 (the L2 term
    of a large weight decay) is not ``3.64e+03`` at every tick."""
    values = np.unique(np.asarray(values, dtype=float))
    step = np.diff(values).min() if len(values) > 1 else 1.0
    return f"%.{max(3, int(np.ceil(np.log10(max(np.abs(values).max(), step) / step))) + 1)}g"


def plane_axis_labels(names: list[str], height: float = 4.4) -> tuple[str, str]:
    """The plane's axes named by the weights spanning them (``names``: w1, w2, w3 first, as ``plane.main`` gives them),
    so that a reader sees which points set the plane and that a unit is a Euclidean distance between weights; the y
    label wrapped to a panel ``height`` inches high (a flat plane's panels are low)."""
    import textwrap

    x = f"x: along {names[1]} - {names[0]} (L2 distance of weights)" if len(names) > 1 else "x (along w2 - w1)"
    y = f"y: towards {names[2]} (\u22a5 x)" if len(names) > 2 else "y"
    return x, "\n".join(textwrap.wrap(y, max(18, int(height * 9)), break_long_words=False))


def plane_figure(path: str | Path, xs: np.ndarray, ys: np.ndarray, surfaces: dict[str, np.ndarray],
                 points: dict[str, tuple[float, float]], trajectory: dict[str, np.ndarray] | None = None,
                 title: str = "") -> Path:
    """Filled contours of each surface (``{label: [len(ys), len(xs)]}``) over the plane's grid.

    ``points`` (the three defining weights first, then any others named) are black crosses with labels, the first
    three naming the axes (:func:`plane_axis_labels`);
    ``trajectory`` maps a name to ``[k, 2]`` projected coordinates, drawn as a dotted path."""
    n = len(surfaces)
    aspect = float(np.ptp(ys) / np.ptp(xs)) if np.ptp(xs) > 0 else 1.0
    axis_labels = plane_axis_labels(list(points), float(np.clip(4.4 * aspect, 1.4, 5.6)))
    height = float(np.clip(4.4 * aspect + 1.4, 2.8, 7.0))  # equal-aspect panels: size the figure to them
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, height), squeeze=False)
    for ax, (label, z) in zip(axes[0], surfaces.items()):
        cf = ax.contourf(xs, ys, z, levels=_levels(z), cmap="viridis")
        ax.contour(xs, ys, z, levels=_levels(z), colors="k", linewidths=0.3, alpha=0.5)
        ax.set_aspect("equal")
        # a colour bar as tall as the (equal-aspect, often wide) axes, not as the figure
        bar = fig.colorbar(cf, cax=make_axes_locatable(ax).append_axes("right", size="4%", pad=0.08),
                           format=_digits(cf.levels))
        fits = max(2, int(4.4 * aspect / 0.22))  # tick labels a flat panel's bar holds without overlapping
        bar.set_ticks(cf.levels[::-(-len(cf.levels) // fits)])
        for name, xy in (trajectory or {}).items():
            xy = np.asarray(xy)
            if len(xy):  # red: seen on every colour of the map and on the white beyond the grid
                ax.plot(xy[:, 0], xy[:, 1], "o:", color="tab:red", markersize=3, linewidth=0.8, label=name)
        for name, (x, y) in points.items():
            ax.plot([x], [y], "kx", markersize=9, markeredgewidth=2)
            # labels of the right half above and to the left (clear of the colour bar), of the left half below and to
            # the right: two points close on one line (w1 and SWA) are never labelled towards each other at one height
            right = x > (xs[0] + xs[-1]) / 2
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(-5, 5) if right else (5, -5), fontsize=9,
                        ha="right" if right else "left", va="bottom" if right else "top",
                        bbox=dict(boxstyle="round,pad=0.2", fc="white", alpha=0.7))
        ax.set_title(label)
        ax.set(xlabel=axis_labels[0], ylabel=axis_labels[1])
        if trajectory:
            ax.legend(loc="lower right", fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def rays_figure(path: str | Path, distances: np.ndarray, curves: dict[str, dict[str, np.ndarray]],
                title: str = "", names: dict[str, str] | None = None) -> Path:
    """Train loss and test error against distance along random rays (paper Fig. 4).

    ``curves[start][metric]`` is ``[directions, len(distances)]``; each start (``swa``, ``sgd``) gets
    one colour, one thin line per direction."""
    colours = {start: style.color_of(start) for start in curves}  # SWA and SGD as in every swalab figure
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (metric, label) in zip(axes, [("train_loss", "train loss (CE + L2)"), ("test_err", "test error (%)")]):
        for start, per_metric in curves.items():
            values = np.asarray(per_metric[metric])
            colour = colours.get(start, None)
            for i, row in enumerate(values):
                ax.plot(distances, row, color=colour, alpha=0.6, linewidth=1,
                        label=(names or {}).get(start, start.upper()) if i == 0 else None)
        ax.set_xlabel("distance along a random unit direction")
        ax.set_ylabel(label)
        ax.ticklabel_format(axis="y", useOffset=False)  # values as they are, not "+3.639e3" above the axis
        ax.legend()
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def segment_figure(path: str | Path, distances: np.ndarray, train_loss: np.ndarray, test_err: np.ndarray,
                   sgd_distance: float, title: str = "", names: tuple[str, str] = ("SWA", "SGD")) -> Path:
    """Train loss (left axis) and test error (right axis) along the SWA-SGD line (paper Fig. 5)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(distances, train_loss, color="tab:blue", marker=".", label="train loss")
    ax.set_xlabel(f"signed distance from {names[0]} (towards {names[1]})")
    ax.set_ylabel("train loss (CE + L2)", color="tab:blue")
    other = ax.twinx()
    other.plot(distances, test_err, color="tab:red", marker=".", label="test error")
    other.set_ylabel("test error (%)", color="tab:red")
    for axis in (ax, other):
        axis.ticklabel_format(axis="y", useOffset=False)  # values as they are, not "+3.639e3" above the axis
    for x, name in [(0.0, names[0]), (sgd_distance, names[1])]:
        ax.axvline(x, color="k", linestyle="--", linewidth=0.8)
        ax.annotate(name, (x, 1.0), xycoords=("data", "axes fraction"), textcoords="offset points",
                    xytext=(3, -12), fontsize=9)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def curves_figure(path: str | Path, curves: list[tuple[str, np.ndarray, np.ndarray]], title: str = "") -> Path:
    """Test error against epoch, one line per ``(label, epochs, values)`` (paper Figs. 6 and 7): SGD iterates dashed in
    SGD's colour, SWA averages solid in SWA's (as in every swalab figure), a second run's in a lighter shade; a log
    axis when the errors span more than a decade, so that the averaging phase is not a flat line at the bottom."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shade = style.shades()
    for label, epochs, values in curves:
        kind = "sgd" if label.endswith(SGD_ITERATE) else "swa"
        ax.plot(epochs, values, label=label, linewidth=1.3, linestyle="--" if kind == "sgd" else "-",
                color=style.color_of(kind, 2 * shade(kind)))
    ax.set_xlabel("epoch")
    style.whole_ticks(ax.xaxis)
    errors = [v for _, _, values in curves for v in np.asarray(values, dtype=float) if v > 0]
    if errors and max(errors) > 10 * min(errors):
        ax.set_yscale("log")
    ax.set_ylabel("test error (%)" + (", log scale" if ax.get_yscale() == "log" else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` atomically, in the format its suffix names (PNG without one): a figure redrawn
    over an earlier one is never left half-written."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # bbox tight: equal-aspect planes leave empty bands otherwise
        atomic_write(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower() or None, dpi=130,
                                                 bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path
