"""The post-hoc figure: accuracy and NLL, on the test set and the validation split, against what each family of
averages was swept over (the SWA window's start, LAWA's k, the EMA decay, the power EMA's sigma_rel, WiSE-FT's alpha, the soup's ingredients),
with the online predictors of the runs marked (``--mark``: SGD, SWA, EMA of their ``metrics.json``, and the pretrained
weights a ``method=pretrained`` run scored: WiSE-FT's alpha = 0 with the weights' own BatchNorm statistics)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from swalab import style

AXES = {"swa": "window start (epoch; the window ends at the last)", "lawa": "k (last snapshots averaged)",
        "ema": "decay per snapshot", "powerema": "sigma_rel (power EMA's width relative to training)", "wiseft": "alpha ((1 - alpha) start + alpha final), BN recomputed",
        "wiseft-bn-interp": "alpha ((1 - alpha) start + alpha final), BN interpolated",
        "soup": "ingredients in the soup"}
ONLINE = ("sgd", "swa", "ema", "pretrained")  # the online predictors a figure marks
METRIC_NAMES = {"acc": "accuracy (%)", "nll": "NLL (mean per image)"}


def on_the_curve(results: Sequence) -> tuple[list, list]:
    """The averages of one family drawn as its curve against the knob, and those drawn apart, each named: SWA windows
    that end before the last snapshot of the family's windows (``swa[25:30]``, an online budget mark's window) share a
    start with the window to the end, so on one curve they would read as the same knob; and every soup, since the
    uniform and the greedy soup are two recipes, not two points of one sweep."""
    windows = [r for r in results if r.family == "swa" and r.built_from]
    last = {run: max(r.built_from[-1] for r in windows if r.run == run) for run in {r.run for r in windows}}
    apart = [r for r in windows if r.built_from[-1] != last[r.run]] + [r for r in results if r.family == "soup"]
    return [r for r in results if r not in apart], apart


def plot(results: Sequence, online: dict[str, dict], path: Path, title: str = "", chosen: Sequence[str] = ()) -> bool:
    """One row of panels (accuracy, NLL) per family of ``results`` (:class:`swalab.posthoc.Result`), test solid,
    validation dashed, in black (``style.METHOD_COLORS['posthoc']``: a post-hoc EMA is never mistaken for the online
    one); ``online``: ``{label: metrics}`` of online predictors, drawn as thin horizontal lines in their method's
    colour; ``chosen``: labels chosen on the validation split (``--select val``), ringed on their test curve. One legend
    per row, beneath its NLL panel (the accuracy panel beside it draws the same lines). False when there is nothing
    to draw."""
    families = [f for f in AXES if any(r.family == f for r in results)]
    if not families:
        return False
    plt = style.pyplot()
    fig, axes = style.panels(plt, 2 * len(families), across=2)
    for row, family in enumerate(families):
        mine, apart = on_the_curve(sorted((r for r in results if r.family == family), key=lambda r: r.knob))
        for col, metric in enumerate(("acc", "nll")):
            ax = axes[2 * row + col]
            xs = [r.knob for r in mine]
            color = style.color_of("posthoc")
            if mine:
                ax.plot(xs, [r.metrics[r.label][metric] for r in mine], "-o", ms=4, color=color,
                        label=f"post-hoc {family}, test")
            for r in apart:  # a SWA window ending before the last snapshot: no point of the curve, named beside it
                ax.plot([r.knob], [r.metrics[r.label][metric]], "x", ms=6, color=color)
                ax.annotate(r.label, (r.knob, r.metrics[r.label][metric]), xytext=(4, 2), textcoords="offset points",
                            fontsize=6, color=color)
            if apart:
                ax.plot([], [], "x", color=color,
                        label=f"post-hoc {family}{' ending earlier' if family == 'swa' else ''} (named), test")
            if mine and all("val" in r.metrics[r.label] for r in mine):
                ax.plot(xs, [r.metrics[r.label]["val"][metric] for r in mine], "--s", ms=4, mfc="none", color=color,
                        label=f"post-hoc {family}, validation")
            picked = [r for r in [*mine, *apart] if r.label in chosen]
            if picked:
                ax.plot([r.knob for r in picked], [r.metrics[r.label][metric] for r in picked], "o", ms=11, mfc="none",
                        mec=color, mew=1.5, label="chosen on validation (its test score)")
            shade = style.shades()  # a second run of one method (a fine-tune's start) in a lighter shade
            for label, m in online.items():
                method = label.split(" ")[0]
                color = style.color_of(method, 2 * shade(method))  # two steps: +ts columns take one
                ax.axhline(m[metric], color=color, lw=1.0, label=f"online {label}, test")
                if "val" in m:
                    ax.axhline(m["val"][metric], color=color, lw=1.0, ls=":", label=f"online {label}, validation")
            if family in ("swa", "lawa", "soup"):
                style.whole_ticks(ax.xaxis)
            ax.set_xlabel(AXES[family])
            style.value_axis(ax, [v for line in ax.get_lines() for v in line.get_ydata()], METRIC_NAMES[metric])
            style.title(ax, f"{family}: {METRIC_NAMES[metric]}")
            if col == 1:
                style.legend_beneath(ax)
    style.suptitle(fig, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    style.finish(plt, fig, path)
    return True
