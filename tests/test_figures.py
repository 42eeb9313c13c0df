"""The report's figures read as a paper's at any number of configs: reports over 1, 3 and 8 configs (rows) are
drawn, and every figure keeps a page's width, wraps its panels into a grid, and has no text on other text (measured
with matplotlib's own text extents); a method has one colour in every figure; axes are linear unless their range
spans an order of magnitude; epochs are whole; a panel's title names the setting that differs, never a path."""

from __future__ import annotations

import re

import pytest
from test_report import m, make_run, with_apart

from swalab import style
from swalab.results import plots
from swalab.results.runs import Run, run_dirs
from swalab.results.table import build_table

WEIGHTS = "/home/someone/checkpoints/very/long/path/to/pretrained_weights_of_a_run.pt"


def history(acc0: float, epochs: int, swa: bool = False) -> list[dict]:
    """Test accuracy rising from ``acc0``; with ``swa`` the average's own score from the middle on."""
    rows = []
    for e in range(1, epochs + 1):
        row = {"epoch": e, "test_acc": acc0 + 2.0 * e}
        if swa and e > epochs // 2:
            row["swa_test_acc"] = acc0 + 2.5 * e
        rows.append(row)
    return rows


def configs(root, n: int) -> None:
    """``n`` configs of SGD, FGE (2 members), SWA and EMA, two seeds each, told apart by a training-set size; the
    first holds a pretrained weights file's absolute path too (a title must not show it)."""
    for k in range(n):
        apart = {"dataset.train_size": 1000 * (k + 1), **({"model.init_from": WEIGHTS} if k == 0 else {})}
        extra = {"dataset": {"train_size": 1000 * (k + 1)}, **({"model": {"init_from": WEIGHTS}} if k == 0 else {})}
        for seed in (0, 1):
            acc0 = 70.0 + k + seed
            curve = [{"members": 1, "acc": acc0 + 10}, {"members": 2, "acc": acc0 + 12}]
            for method, budget, metrics in (
                    ("sgd", 1.0, {"sgd": m(acc0 + 8)}),
                    ("fge", 1.0, {"fge": m(acc0 + 12, members=2, curve=curve)}),
                    ("swa", 1.5, {"swa": m(acc0 + 11), "swa@1": m(acc0 + 9, budget=1.0, epoch=4)}),
                    ("ema", 1.0, {"ema": m(acc0 + 9)})):
                run = make_run(root, method, seed, metrics, budget=budget, name=f"c{k}", extra=extra,
                               history=history(acc0, round(budget * 4), swa=method == "swa"))
                with_apart(run, apart)


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function finishes, kept open (and written, so that it can be looked at)."""
    kept = []
    real = style.finish

    def keep(plt, fig, path):
        real(plt, fig, path, close=False)
        fig.canvas.draw()  # laid out again at the figure's own dpi, where its texts are measured
        kept.append(fig)

    monkeypatch.setattr(style, "finish", keep)
    return kept


def undrawn_tick_labels(fig, renderer) -> set[int]:
    """The tick labels matplotlib keeps beyond an axis's view (it does not draw them)."""
    out = set()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for axis, low, high, centre in ((ax.xaxis, box.x0, box.x1, lambda b: (b.x0 + b.x1) / 2),
                                        (ax.yaxis, box.y0, box.y1, lambda b: (b.y0 + b.y1) / 2)):
            for label in axis.get_ticklabels(which="both"):
                if not low - 1 <= centre(label.get_window_extent(renderer)) <= high + 1:
                    out.add(id(label))
    return out


def texts_of(fig):
    """Every visible, non-empty text of ``fig`` that is drawn, with its extent in pixels."""
    renderer = fig.canvas.get_renderer()
    out, seen = [], undrawn_tick_labels(fig, renderer)
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        if id(text) in seen:
            continue
        seen.add(id(text))
        if text.get_visible() and text.get_text().strip() and text.get_figure() is fig:
            try:
                box = text.get_window_extent(renderer)
            except (RuntimeError, ValueError):
                continue
            if box.width > 0 and box.height > 0:
                out.append((text.get_text(), box))
    return out


def overlapping(fig) -> list[tuple[str, str]]:
    texts = texts_of(fig)
    return [(a, b) for i, (a, box_a) in enumerate(texts) for b, box_b in texts[i + 1:]
            if box_a.overlaps(box_b) and box_a.intersection(box_a, box_b).width > 1
            and box_a.intersection(box_a, box_b).height > 1]


@pytest.mark.parametrize("n", [1, 3, 8])
def test_a_report_over_n_configs_has_figures_of_a_pages_width_in_a_grid_of_panels_and_no_text_on_text(
        tmp_path, figures, n):
    configs(tmp_path / "g", n)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "g"])])
    assert len(table.rows) == n
    for name, plot in (("test_error", plots.plot_test_error), ("fge_curve", plots.plot_fge_curve),
                       ("reliability", plots.plot_reliability)):
        assert plot(table, tmp_path / f"{name}_{n}.png"), name
        fig = figures[-1]
        assert fig.get_figwidth() <= 15.5, (name, fig.get_figwidth())
        assert fig.get_figheight() <= 8 * (-(-n // 3)) + 2, (name, fig.get_figheight())
        assert not overlapping(fig), (name, overlapping(fig)[:5])
        panels = [ax for ax in fig.axes if ax.get_title()]
        assert len(panels) == n
        across = len({round(ax.get_position().x0, 2) for ax in panels})
        assert across == min(n, 3), (name, across)
        for ax in panels:
            assert "/home/" not in ax.get_title() and "checkpoints/" not in ax.get_title()
            assert len(ax.get_title()) <= (120 if n == 1 else 80), ax.get_title()


def test_panel_titles_name_the_setting_that_differs_and_the_figure_what_all_share(tmp_path, figures):
    configs(tmp_path / "g", 3)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "g"])])
    plots.plot_test_error(table, tmp_path / "test_error.png")
    fig = figures[-1]
    titles = sorted(ax.get_title().replace("\n", " ") for ax in fig.axes if ax.get_title())
    assert titles == ["dataset.train_size=1000, model.init_from=pretrained_weights_of_a_run.pt",
                      "dataset.train_size=2000", "dataset.train_size=3000"]
    assert "cifar10 / preresnet20" in fig._suptitle.get_text()


def test_a_method_keeps_its_colour_in_every_figure(tmp_path, figures):
    """SWA 1B beside SWA 1.5B in one panel is a lighter shade of SWA's colour; no two methods share one."""
    configs(tmp_path / "g", 1)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "g"])])
    colours: dict[str, set] = {}
    for plot in (plots.plot_test_error, plots.plot_fge_curve, plots.plot_reliability):
        plot(table, tmp_path / "figure.png")
        for ax in figures[-1].axes:
            for line in ax.get_lines():
                found = re.match(r"(SGD|FGE|SWA|EMA)\b", line.get_label())
                if found:
                    colours.setdefault(found.group(1), set()).add(style.to_hex(line.get_color()))
    assert set(colours) == {"SGD", "FGE", "SWA", "EMA"}
    for method, seen in colours.items():
        assert style.color_of(method.lower()) in seen
        assert seen <= {style.color_of(method.lower(), shade) for shade in range(4)}, (method, seen)
    assert not any(colours[a] & colours[b] for a in colours for b in colours if a != b)


def test_a_methods_budgets_in_one_panel_differ_in_more_than_a_shade(tmp_path, figures):
    """SWA 1B beside SWA 1.5B (and 1.25B) are shades of one green, which a reader (or a grey print) cannot tell
    apart: in the reliability diagram each has its own marker, in the FGE curve each SWA line its own dash."""
    configs(tmp_path / "g", 1)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "g"])])
    plots.plot_reliability(table, tmp_path / "reliability.png")
    swa = [line for line in figures[-1].axes[0].get_lines() if line.get_label().startswith("SWA ")]
    assert len(swa) == 2 and swa[0].get_marker() != swa[1].get_marker(), [l.get_marker() for l in swa]
    plots.plot_fge_curve(table, tmp_path / "fge_curve.png")
    legend = figures[-1].axes[0].get_legend()  # its handles are the lines drawn: the legend tells them apart too
    swa = [h for t, h in zip(legend.get_texts(), legend.legend_handles) if t.get_text().startswith("SWA ")]
    dashes = [(h.get_linestyle(), h._dash_pattern) for h in swa]  # "--" names every dash pattern; its lengths differ
    assert len(swa) == 2 and dashes[0] != dashes[1], dashes


def test_test_error_is_linear_over_a_narrow_range_with_whole_epochs_and_its_bands_named(tmp_path, figures):
    configs(tmp_path / "g", 1)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "g"])])
    plots.plot_test_error(table, tmp_path / "test_error.png")
    ax = next(ax for ax in figures[-1].axes if ax.get_lines())
    assert ax.get_yscale() == "linear"  # 8% to 22% error: not an order of magnitude
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert len([t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]) >= 3
    said = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "band: lowest to highest seed" in said


def test_an_error_range_over_an_order_of_magnitude_is_drawn_on_a_log_axis():
    assert style.wants_log([0.5, 2.0, 30.0]) and not style.wants_log([8.0, 22.0])


def test_an_fge_run_of_one_member_draws_no_fge_curve(tmp_path):
    root = tmp_path / "g"
    for seed in (0, 1):
        make_run(root, "fge", seed, {"fge": m(96.0, members=1, curve=[{"members": 1, "acc": 96.0}])})
        make_run(root, "swa", seed, {"swa": m(91.5)}, budget=1.5)
    assert not plots.plot_fge_curve(build_table([Run(p) for p in run_dirs([root])]), tmp_path / "fge.png")
