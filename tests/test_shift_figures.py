"""The report's figures of runs scored under shift (``swalab.results.shift_plots``): accuracy and ECE against
corruption severity (a box over the corruptions per predictor, seeds averaged first) and ROC curves per OOD set, made
from fake run directories with ``scores/`` as ``python -m swalab.results.score`` writes them; the right panels, no
legend on an axis, a method in its own colour; no figure without ``scores/``, and no ROC (said in one line) from OOD
records scored before per-image scores were kept."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import torch
from test_figures import figures, overlapping  # noqa: F401  (figures: a fixture)
from test_report import m, make_run, with_apart

from swalab import style
from swalab.checkpoint import atomic_save
from swalab.results import ood, shift_plots
from swalab.results.report import report
from swalab.results.runs import Run, run_dirs
from swalab.results.table import build_table

CORRUPTIONS = ("contrast", "gaussian_noise", "fog")
OOD_SETS = ("noise:gaussian", "folder:/data/imagenette/val")


def corrupted_acc(method: str, seed: int, corruption: str, severity: int) -> float:
    """A fake accuracy: SWA a point above SGD, falling with severity, seeds two points apart."""
    return 90.0 - 12 * severity - 3 * CORRUPTIONS.index(corruption) + (1.0 if method == "swa" else 0.0) + 2 * seed


def write_scores(run, method: str, seed: int, per_image: bool = True) -> None:
    """``scores/`` as ``python -m swalab.results.score`` writes it: each corruption at severities 1..5, the clean test
    set, and the OOD sets, with (``per_image``) or without the per-image scores of the OOD records."""
    predictors = [method, f"{method}+ts"]
    for c in CORRUPTIONS:
        for s in range(1, 6):
            folder = run / "scores" / f"cifar10c-{c}-{s}"
            folder.mkdir(parents=True)
            record = {"data": {"name": folder.name, "corruption": c, "severity": s},
                      "predictors": {p: m(corrupted_acc(method, seed, c, s) - ("+ts" in p), ece=0.02 * s, brier=0.1)
                                     for p in predictors}}
            (folder / "metrics.json").write_text(json.dumps(record))
    folder = run / "scores" / "test"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps(
        {"data": {"name": "test"}, "predictors": {p: m(95.0 + seed, ece=0.01, brier=0.08) for p in predictors}}))
    generator = torch.Generator().manual_seed(10 * seed + (method == "swa"))
    for spec in OOD_SETS:
        folder = run / "scores" / ood.spec_name(spec)
        folder.mkdir()
        scores = {p: {"msp": (torch.rand(40, generator=generator), torch.rand(30, generator=generator) + 0.3),
                      "entropy": (torch.rand(40, generator=generator), torch.rand(30, generator=generator) + 0.5)}
                  for p in predictors}
        record = {"data": {"name": folder.name, "spec": spec, "in_distribution": 40, "out_of_distribution": 30},
                  "predictors": {p: {s: ood.detection(*v) for s, v in by.items()} for p, by in scores.items()}}
        (folder / "metrics.json").write_text(json.dumps(record))
        if per_image:
            atomic_save(ood.kept_scores(scores), folder / ood.PER_IMAGE_FILE)


def shifted(root, rows: int = 1, per_image: bool = True, seeds=(0, 1)) -> None:
    """SGD and SWA runs of ``rows`` configs (told apart by a training-set size), ``seeds`` each, scored under shift."""
    for k in range(rows):
        extra = {"dataset": {"train_size": 1000 * (k + 1)}}
        for seed in seeds:
            for method, budget in (("sgd", 1.0), ("swa", 1.5)):
                run = make_run(root, method, seed, {method: m(95.0 + seed), f"{method}+ts": m(95.0 + seed)},
                               budget=budget, name=f"c{k}", extra=extra)
                with_apart(run, {"dataset.train_size": 1000 * (k + 1)})
                write_scores(run, method, seed, per_image)


def table_of(root):
    return build_table([Run(p) for p in run_dirs([root])])


def legends_off_axes(fig) -> bool:
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
    legends = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
    return bool(legends) and not any(lg.overlaps(box) for lg in legends for box in boxes)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_corruption_figure_has_an_accuracy_and_an_ece_panel_per_row_and_nothing_overlaps(tmp_path, figures, rows):
    shifted(tmp_path / "g", rows)
    assert shift_plots.plot_shift_corruptions(table_of(tmp_path / "g"), tmp_path / "shift_corruptions.png")
    assert (tmp_path / "shift_corruptions.png").exists() and (tmp_path / "shift_corruptions.pdf").exists()
    fig = figures[-1]
    assert len(fig.axes) == 2 * rows
    assert len([ax for ax in fig.axes if ax.get_legend()]) == rows  # one legend per row, beside its panels
    assert [ax.get_ylabel() for ax in fig.axes] == ["accuracy (%)", "ECE (15 equal-width bins)"] * rows
    assert len({round(ax.get_position().y0, 2) for ax in fig.axes}) == rows  # a row of the figure per config
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["clean", "1", "2", "3", "4", "5"]
    assert fig.get_figwidth() <= 15.5
    assert legends_off_axes(fig)
    assert not overlapping(fig), overlapping(fig)[:5]


def test_a_box_of_one_corruption_still_shows_whose_it_is_in_its_colour(tmp_path, figures):
    """One corruption scored: each box has no height and its black median was all there was to see, the same for
    every predictor; the value is marked in its predictor's colour, as the legend says."""
    import shutil

    shifted(tmp_path / "g")
    for folder in (tmp_path / "g").rglob("scores/cifar10c-*"):
        if not folder.name.startswith("cifar10c-contrast-"):
            shutil.rmtree(folder)
    assert shift_plots.plot_shift_corruptions(table_of(tmp_path / "g"), tmp_path / "shift_corruptions.png")
    acc = figures[-1].axes[0]
    colours = {style.to_hex(c) for c in (style.color_of("sgd"), style.color_of("sgd", 1), style.color_of("swa"),
                                          style.color_of("swa", 1))}
    marked = [line for line in acc.get_lines() if line.get_marker() == "s" and len(line.get_xdata()) == 5]
    assert {style.to_hex(line.get_color()) for line in marked} == colours
    sgd = next(line for line in marked if style.to_hex(line.get_color()) == style.color_of("sgd"))
    assert list(sgd.get_ydata()) == pytest.approx([statistics.fmean(corrupted_acc("sgd", seed, "contrast", s)
                                                                    for seed in (0, 1)) for s in range(1, 6)])
    legend = " ".join(t.get_text() for t in figures[-1].axes[1].get_legend().get_texts()).replace("\n", " ")
    assert "a square in its colour: one corruption" in legend


def test_a_box_is_over_the_corruptions_each_first_averaged_over_seeds(tmp_path):
    shifted(tmp_path / "g")
    row = table_of(tmp_path / "g").rows[0]
    swa = next(cell for column, cell in row.cells.items() if column.method == "swa")
    values = shift_plots.severity_values(swa, "acc")
    assert sorted(values) == [0, 1, 2, 3, 4, 5]
    assert values[0] == [95.5]  # the clean test set: the mean of seeds 95 and 96
    assert sorted(values[3]) == sorted(statistics.fmean(corrupted_acc("swa", s, c, 3) for s in (0, 1))
                                       for c in CORRUPTIONS)


def test_sets_scored_for_some_predictors_only_are_named_in_the_legend_not_silently_dropped(tmp_path, figures):
    """Every box of a severity is over the corruptions every predictor was scored on; a severity scored for SGD only
    (or more corruptions of it) then draws nothing of them, and the legend says what it left out."""
    shifted(tmp_path / "g", seeds=(0,))
    for record in (tmp_path / "g").rglob("scores/cifar10c-*/metrics.json"):
        if "/swa/" in str(record) and (record.parent.name.endswith("-3") or record.parent.name == "cifar10c-fog-5"):
            record.unlink()
            record.parent.rmdir()
    assert shift_plots.plot_shift_corruptions(table_of(tmp_path / "g"), tmp_path / "shift_corruptions.png")
    legend = next(ax.get_legend() for ax in figures[-1].axes if ax.get_legend())
    said = " ".join(t.get_text().replace("\n", " ") for t in legend.get_texts())
    assert "not drawn: 3 corruptions at severity 3, 1 at severity 5" in said, said


def test_the_clean_severity_falls_back_on_the_runs_own_metrics_without_scores_test(tmp_path):
    shifted(tmp_path / "g", seeds=(0,))
    for test in (tmp_path / "g").rglob("scores/test/metrics.json"):
        test.unlink()
    row = table_of(tmp_path / "g").rows[0]
    sgd = next(cell for column, cell in row.cells.items() if column.method == "sgd")
    assert shift_plots.severity_values(sgd, "acc")[0] == [95.0]


@pytest.mark.parametrize("scores", [shift_plots.DEFAULT_ROC_SCORES, ("msp", "entropy")])
def test_the_roc_figure_has_a_panel_per_ood_set_a_curve_per_predictor_and_score_and_the_diagonal(
        tmp_path, figures, scores):
    """MSP by default (mutual information too where stored: none of these runs is an ensemble); entropy when asked."""
    shifted(tmp_path / "g")
    assert shift_plots.plot_ood_roc(table_of(tmp_path / "g"), tmp_path / "ood_roc.png", scores)
    fig = figures[-1]
    assert len(fig.axes) == len(OOD_SETS)
    titles = sorted(ax.get_title().replace("\n", " ") for ax in fig.axes)
    assert titles == ["OOD: folder imagenette/val (40 test vs 30 OOD images)",
                      "OOD: noise:gaussian (40 test vs 30 OOD images)"]
    for ax in fig.axes:
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels[0] == "chance (AUROC 0.5)" and list(ax.get_lines()[0].get_xdata()) == [0, 1]
        assert len(labels) == 1 + 4 * (len(scores) - ("mutual_information" in scores))  # SGD, SGD+ts, SWA, SWA+ts
        assert ("entropy" in " ".join(labels)) == ("entropy" in scores)
        assert all(re.search(r"AUROC 0\.\d{3} ± 0\.\d{3} \(n=2", label) for label in labels[1:])
        assert ax.get_xlabel().startswith("false positive rate") and ax.get_ylabel().startswith("true positive rate")
    assert legends_off_axes(fig)
    assert not overlapping(fig), overlapping(fig)[:5]


def test_a_roc_curve_after_temperature_scaling_differs_from_its_predictors_in_more_than_a_shade(tmp_path, figures):
    """SGD and SGD+ts (SWA and SWA+ts) are two shades of one colour and, for one score, one line style: the committed
    GPU figure's SGD and SGD+ts curves were told apart by shade alone. The second column of a method has markers."""
    shifted(tmp_path / "g")
    assert shift_plots.plot_ood_roc(table_of(tmp_path / "g"), tmp_path / "ood_roc.png")
    legend = figures[-1].axes[0].get_legend()
    drawn = {t.get_text().split(" · ")[0]: h for t, h in zip(legend.get_texts(), legend.legend_handles)}
    for method in ("SGD", "SWA"):
        plain = next(h for k, h in drawn.items() if k.startswith(f"{method} "))
        scaled = next(h for k, h in drawn.items() if k.startswith(f"{method}+ts"))
        assert (plain.get_marker(), plain.get_linestyle()) != (scaled.get_marker(), scaled.get_linestyle()), method


def test_the_legends_auroc_is_the_mean_over_seeds_of_the_records(tmp_path, figures):
    shifted(tmp_path / "g")
    table = table_of(tmp_path / "g")
    shift_plots.plot_ood_roc(table, tmp_path / "ood_roc.png")
    swa = next(cell for column, cell in table.rows[0].cells.items() if column.method == "swa")
    aurocs = [e.run.scores["ood-noise-gaussian"]["predictors"]["swa"]["msp"]["auroc"] for e in swa.entries]
    ax = next(ax for ax in figures[-1].axes if "gaussian" in ax.get_title())
    label = next(line.get_label() for line in ax.get_lines() if line.get_label().startswith("SWA 1.5B (6 ep) · MSP"))
    assert f"AUROC {statistics.fmean(aurocs):.3f} ± {statistics.stdev(aurocs):.3f}" in label


def test_a_method_keeps_its_colour_in_both_figures(tmp_path, figures):
    """SGD blue and SWA green as in every other figure; SWA+ts a lighter shade of SWA's."""
    shifted(tmp_path / "g")
    table = table_of(tmp_path / "g")
    seen: dict[str, set] = {}
    shift_plots.plot_shift_corruptions(table, tmp_path / "c.png")
    for ax in figures[-1].axes:
        for handle in ax.get_legend().legend_handles if ax.get_legend() else ():
            found = re.match(r"(SGD|SWA)(\+ts)? ", handle.get_label())
            if found:
                seen.setdefault(found.group(0).strip(), set()).add(style.to_hex(handle.get_edgecolor()))
    shift_plots.plot_ood_roc(table, tmp_path / "r.png")
    for ax in figures[-1].axes:
        for line in ax.get_lines():
            found = re.match(r"(SGD|SWA)(\+ts)? ", line.get_label())
            if found:
                seen.setdefault(found.group(0).strip(), set()).add(style.to_hex(line.get_color()))
    assert seen == {"SGD": {style.color_of("sgd")}, "SWA": {style.color_of("swa")},
                    "SGD+ts": {style.color_of("sgd", 1)}, "SWA+ts": {style.color_of("swa", 1)}}


def test_a_report_draws_both_figures_of_runs_scored_under_shift(tmp_path):
    shifted(tmp_path / "g")
    written = report([tmp_path / "g"], tmp_path / "out")["written"]
    assert {"shift_corruptions.png", "shift_corruptions.pdf", "ood_roc.png", "ood_roc.pdf"} <= set(written)


def test_a_report_without_scores_makes_neither_figure_and_drops_an_earlier_reports(tmp_path):
    shifted(tmp_path / "g")
    report([tmp_path / "g"], tmp_path / "out")
    root = tmp_path / "plain"
    for seed in (0, 1):
        make_run(root, "sgd", seed, {"sgd": m(90.0)})
        make_run(root, "swa", seed, {"swa": m(91.0)}, budget=1.5)
    result = report([root], tmp_path / "out")
    assert not {"shift_corruptions.png", "ood_roc.png"} & set(result["written"])
    assert not (tmp_path / "out" / "shift_corruptions.png").exists() and not (tmp_path / "out" / "ood_roc.png").exists()
    assert not any("ROC" in note for note in result["notes"])


def test_ood_records_without_per_image_scores_draw_no_roc_and_the_report_says_why_in_one_line(tmp_path):
    shifted(tmp_path / "g", per_image=False)
    result = report([tmp_path / "g"], tmp_path / "out")
    assert "ood_roc.png" not in result["written"] and "shift_corruptions.png" in result["written"]
    said = [note for note in result["notes"] if "ROC" in note]
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("no ROC curve for 8 OOD record(s) without per-image scores")
    assert "--ood <spec> again" in said[0]
    assert said[0] in (tmp_path / "out" / "table.md").read_text()


def test_the_area_under_the_roc_curve_is_the_auroc_ties_counted_half():
    ins = torch.tensor([0.1, 0.2, 0.2, 0.5, 0.9, 0.3])
    outs = torch.tensor([0.2, 0.6, 0.9, 0.9, 0.4])
    fpr, tpr = ood.roc_curve(ins, outs)
    assert (fpr[0], tpr[0]) == (0.0, 0.0) and (fpr[-1], tpr[-1]) == (1.0, 1.0)
    area = float(sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(ood.auroc(ins, outs), abs=1e-12)


def test_kept_scores_read_back_as_they_were_to_float16(tmp_path):
    ins, outs = torch.rand(50).double(), torch.rand(20).double()
    atomic_save(ood.kept_scores({"swa": {"msp": (ins, outs)}}), tmp_path / ood.PER_IMAGE_FILE)
    back = ood.read_kept_scores(tmp_path / ood.PER_IMAGE_FILE)
    assert torch.allclose(back["swa"]["msp"][0], ins.float(), atol=1e-3) and back["swa"]["msp"][1].shape == (20,)
    assert ood.read_kept_scores(tmp_path / "absent.pt") is None


def test_no_roc_curve_averages_seeds_scored_on_other_images(tmp_path, figures):
    """A folder that changed between two score commands: the seeds' records of one name hold other images. The
    summary table refuses to average them (test_shift_summary); the figure draws no mean curve of them either."""
    shifted(tmp_path / "g")
    for seed, fingerprint in ((0, "before"), (1, "after")):
        for path in (tmp_path / "g").rglob(f"seed{seed}/scores/ood-noise-gaussian/metrics.json"):
            record = json.loads(path.read_text())
            record["data"]["fingerprint"] = fingerprint
            path.write_text(json.dumps(record))
    assert shift_plots.plot_ood_roc(table_of(tmp_path / "g"), tmp_path / "ood_roc.png")
    for ax in figures[-1].axes:
        labels = [line.get_label() for line in ax.get_lines()][1:]
        if "gaussian" in ax.get_title():
            assert labels == [], labels
        else:  # the folder's records hold the same images: averaged as before
            assert len(labels) == 4 and all("(n=2)" in label for label in labels), labels


def test_columns_scored_on_other_versions_of_one_ood_folder_are_drawn_in_a_panel_each_never_in_one(tmp_path, figures):
    """The folder changed between the score commands of the SGD runs and of the SWA runs: each column's seeds agree,
    the columns do not. A panel per version, its title naming the images, each with its own columns' curves."""
    shifted(tmp_path / "g")
    for method, fingerprint in (("sgd", "1111aaaa-before"), ("swa", "2222bbbb-after")):
        for path in (tmp_path / "g").rglob("scores/ood-noise-gaussian/metrics.json"):
            if Run(path.parents[2]).method == method:
                record = json.loads(path.read_text())
                record["data"]["fingerprint"] = fingerprint
                path.write_text(json.dumps(record))
    assert shift_plots.plot_ood_roc(table_of(tmp_path / "g"), tmp_path / "ood_roc.png")
    drawn = {ax.get_title().replace("\n", " "): sorted(line.get_label().split()[0] for line in ax.get_lines()[1:])
             for ax in figures[-1].axes}
    assert drawn == {"OOD: noise:gaussian (40 test vs 30 OOD images), images 1111aaaa": ["SGD", "SGD+ts"],
                     "OOD: noise:gaussian (40 test vs 30 OOD images), images 2222bbbb": ["SWA", "SWA+ts"],
                     "OOD: folder imagenette/val (40 test vs 30 OOD images)": ["SGD", "SGD+ts", "SWA", "SWA+ts"]}, drawn
