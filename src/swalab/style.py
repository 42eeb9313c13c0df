"""One style for every figure swalab draws (the report's, ``swalab.results.plots``, and the analyses',
``swalab.analysis.plots``), so that a figure reads the same in every place a paper puts it:

* a method has one colour in every figure (:data:`METHOD_COLORS`): SWA is the same green in the test-error curves,
  the FGE curve and the reliability diagrams; what differs within a method (its budgets, other settings) is a
  shade of that colour, with a marker or dash of its own (shades alone are not told apart);
* an axis is linear unless its values span an order of magnitude (:func:`wants_log`); epochs and member counts
  are whole numbers (:func:`whole_ticks`); an axis has at least three ticks;
* panels wrap into a grid (:func:`panels`, at most :data:`ACROSS` to a row) whatever the number of configs, each
  titled by what sets it apart (:func:`panel_titles`), never by a path; what all panels share is the figure's title;
* a band is named in the legend (:data:`BAND`).

Matplotlib runs with its Agg backend (no display) and without LaTeX."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Callable, Sequence

#: colour of each method, the same in every figure (matplotlib's tab10, one hue per method)
METHOD_COLORS = {"sgd": "#1f77b4", "pretrained": "#7f7f7f", "fge": "#ff7f0e", "swa": "#2ca02c", "swag": "#9467bd",
                 "swag_diag": "#8c564b", "ema": "#d62728", "posthoc": "#000000"}  # post hoc: black beside the online
OTHER_COLORS = ("#e377c2", "#17becf", "#bcbd22")  # a method of one's own, chosen by its name
ACROSS = 3          # panels to a row: three 5-inch panels are a page's width at legible text
PANEL = (5.0, 3.8)  # a panel's width and height in inches
BAND = "band: lowest to highest seed"  # what a band over seeds is, said in the legend
#: marker of a method's k-th column in a panel (SWA 1B, 1.25B, 1.5B; SGD and SGD+ts): shades of one colour alone are
#: not told apart (nor in a grey print)
SHADE_MARKERS = "osD^"


def pyplot():
    """matplotlib.pyplot on the Agg backend, without LaTeX."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.usetex"] = False
    import matplotlib.pyplot as plt

    return plt


def to_hex(color) -> str:
    from matplotlib.colors import to_hex as hex_of

    return hex_of(color)


def color_of(method: str, shade: int = 0) -> str:
    """The colour of ``method`` (``swa``, ``swa+ts``, ``swa@1.25`` are SWA's), lighter by ``shade`` steps for the
    method's other budgets or settings in one panel."""
    from matplotlib.colors import to_rgb

    base = re.split(r"[+@]", method.lower())[0]
    own = OTHER_COLORS[sum(map(ord, base)) % len(OTHER_COLORS)]  # a method of one's own: the same from its name
    rgb = to_rgb(METHOD_COLORS.get(base, own))
    mix = min(shade, 3) * 0.22  # towards white, at most two thirds of the way
    return to_hex(tuple(c + (1 - c) * mix for c in rgb))


def shades() -> Callable[[str], int]:
    """A panel's count of each method's columns (or runs): called with a column's method, how many of that method's
    came before it (0, 1, 2 ...), the shade of its colour (:func:`color_of`) and its marker (:data:`SHADE_MARKERS`)."""
    seen: dict[str, int] = {}

    def shade(method: str) -> int:
        seen[method] = seen.get(method, -1) + 1
        return seen[method]
    return shade


def wants_log(values: Sequence[float]) -> bool:
    """Whether an axis over ``values`` (all positive) should be logarithmic: only when they span an order of
    magnitude (75-82% error is read on a linear axis; 0.5-30% on a log one)."""
    positive = [v for v in values if v > 0]
    return bool(positive) and max(positive) / min(positive) >= 10


def whole_ticks(axis) -> None:
    """Ticks at whole numbers only (epochs, members): never at 2.5."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=2))


def enough_ticks(axis) -> None:
    """At least three ticks on a linear axis, so that its scale can be read."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=3))


def plain_log_ticks(axis) -> None:
    """Tick labels of a log axis in plain numbers (1, 2, 5, 10, 20, 50), not 2×10^1."""
    import math

    from matplotlib.ticker import FuncFormatter

    def minor(v, _):  # within one decade every minor tick is labelled (30, 40, ...), else only 2 and 5
        low, high = sorted(axis.get_view_interval())
        shown = range(2, 10) if low > 0 and high / low < 10 else (2, 5)
        return f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in shown else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def value_axis(ax, values: Sequence[float], label: str) -> None:
    """The y axis of ``values``: log (said in its label, plain tick labels) when they span an order of
    magnitude, else linear with at least three ticks."""
    if wants_log(values):
        ax.set_yscale("log")
        ax.set_ylabel(f"{label} (log scale)")
        plain_log_ticks(ax.yaxis)
    else:
        ax.set_ylabel(label)
        enough_ticks(ax.yaxis)


def panels(plt, n: int, width: float = PANEL[0], height: float = PANEL[1], across: int = ACROSS):
    """``n`` panels of ``width`` x ``height`` inches in rows of at most ``across`` (the last row's unused places left
    blank), laid out by matplotlib's constrained layout, which keeps titles, labels and legends beneath the axes
    apart; returns the figure and the panels."""
    across = max(1, min(n, across))
    rows = -(-n // across)
    fig, axes = plt.subplots(rows, across, figsize=(width * across, height * rows), squeeze=False,
                             layout="constrained")
    flat = [ax for line in axes for ax in line]
    for ax in flat[n:]:
        ax.remove()
    return fig, flat[:n]


def short_value(value: str) -> str:
    """A value as a title shows it: a path by its file or folder name only (``/data/w/resnet.pt`` -> ``resnet.pt``)."""
    return Path(value.rstrip("/")).name or value if "/" in value else value


def label_items(name: str, label: str) -> list[str]:
    """``[name, "key=value", ...]`` of a row label (``dataset.train_size=1000, model.swa.lr=0.05``), each value
    shortened (:func:`short_value`)."""
    parts = [p for p in re.split(r", (?=[\w.+\-]+=)", label) if p] if label else []
    return [name, *(f"{k}={short_value(v)}" for k, _, v in (p.partition("=") for p in parts))]


def panel_titles(items: Sequence[Sequence[str]]) -> tuple[str, list[str]]:
    """What every panel shares (the figure's title) and each panel's own title: the items (``digits /
    preresnet20``, ``dataset.train_size=1000``) only it holds. A lone panel is titled by all of its items."""
    if len(items) == 1:
        return "", [", ".join(items[0])]
    shared = [i for i in items[0] if all(i in other for other in items[1:])]
    own = [", ".join(i for i in its if i not in shared) or "(the defaults)" for its in items]
    return ", ".join(shared), own


def title(ax, text: str, width: float = PANEL[0]) -> None:
    """``text`` as the title of a panel ``width`` inches wide, wrapped at its words so that it stays over its own
    panel."""
    chars = max(20, int(width * 0.77 * 10.5))  # 12 pt text, about 10.5 characters per inch, over the axes' width
    ax.set_title("\n".join(textwrap.wrap(text, chars, break_long_words=False, break_on_hyphens=False)))


def suptitle(fig, text: str) -> None:
    """What all panels share, over the figure, wrapped to its width."""
    if text:
        chars = max(40, int(fig.get_figwidth() * 0.9 * 10.5))
        fig.suptitle("\n".join(textwrap.wrap(text, chars, break_long_words=False, break_on_hyphens=False)))


def legend_beneath(ax, below: float = 34, **kwargs):
    """The panel's legend beneath its axes (never on a curve), ``below`` points under them (clear of the tick labels
    and the axis label), one column, small type."""
    from matplotlib.transforms import ScaledTranslation

    anchor = ax.transAxes + ScaledTranslation(0, -below / 72, ax.figure.dpi_scale_trans)
    return ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=anchor,
                     frameon=False, **kwargs)


def finish(plt, fig, path: Path, close: bool = True) -> None:
    """Save ``path`` (PNG, 150 dpi) and the same figure as PDF beside it (vector, for a paper)."""
    fig.savefig(path, dpi=150, bbox_inches="tight")  # tight: a legend placed beneath its axes is kept whole
    # undated (no CreationDate): a report made again from the same runs writes the same bytes
    fig.savefig(Path(path).with_suffix(".pdf"), bbox_inches="tight", metadata={"CreationDate": None})
    if close:
        plt.close(fig)
