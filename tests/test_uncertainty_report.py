"""The report's uncertainty columns: predictors at their fitted temperature (``+ts``), SWAG standing in for SWA,
ensembles of seeds (deep ensembles, MultiSWAG) from saved predictions, reliability diagrams with ECE and Brier."""

from __future__ import annotations

import pytest
import torch

from swalab import style
from swalab.evaluate import metrics_from_log_probs
from swalab.results import plots
from swalab.results.report import main, report
from swalab.results.table import Column

from test_report import cell_values, make_run, table_lines
from test_report import m as m_without_brier

LABELS = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1])


def m(acc, nll=0.5, **more):
    return m_without_brier(acc, nll, brier=0.25, **more)


def save_predictions(run, predictor_log_probs: dict, labels=LABELS):
    torch.save({"probs": {k: v.exp().half() for k, v in predictor_log_probs.items()},
                "log_probs": {k: v.half() for k, v in predictor_log_probs.items()}, "labels": labels},
               run / "predictions.pt")


def random_log_probs(seed: int) -> torch.Tensor:
    return (3 * torch.randn(len(LABELS), 3, generator=torch.Generator().manual_seed(seed))).log_softmax(1)


@pytest.fixture
def uncertainty_grid(tmp_path):
    """Two seeds of SGD and of SWAG (which stands in for SWA), each predictor with its +ts twin, predictions saved."""
    root = tmp_path / "grid"
    for seed in (0, 1):
        sgd = make_run(root, "sgd", seed, {"sgd": m(80.0 + seed, nll=0.9), "sgd+ts": m(80.0 + seed, nll=0.7,
                                                                                           temperature=1.5 + seed)})
        save_predictions(sgd, {"sgd": random_log_probs(seed), "sgd+ts": random_log_probs(10 + seed)})
        swag_metrics = {"swa": m(82.0 + seed, nll=0.8), "swa+ts": m(82.0 + seed, nll=0.6, temperature=1.2),
                        "sgd": m(1.0), "swag": m(83.0 + seed, nll=0.65), "swag+ts": m(83.0 + seed, nll=0.6,
                                                                                      temperature=1.1),
                        "swag_diag": m(82.5, nll=0.7)}
        swag = make_run(root, "swag", seed, swag_metrics, budget=1.5)
        save_predictions(swag, {"swa": random_log_probs(20 + seed), "swag": random_log_probs(30 + seed),
                                "swag_diag": random_log_probs(40 + seed)})
    return root


def test_a_predictor_at_its_fitted_temperature_is_a_column_beside_its_own(uncertainty_grid, tmp_path):
    report([uncertainty_grid], tmp_path / "out")
    header = table_lines(tmp_path / "out", "Test NLL (mean per image)")[0]
    assert header == ("| row | SGD 1B (4 ep) | SGD+ts 1B (4 ep) | SWA 1.5B (6 ep) | SWA+ts 1.5B (6 ep) | SWAG 1.5B (6 ep) "
                      "| SWAG+ts 1.5B (6 ep) | SWAG-diag 1.5B (6 ep) |")
    assert cell_values(tmp_path / "out", "SWA+ts 1.5B (6 ep)", "nll")[0]["mean"] == "0.600000"
    paired = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", 1)[0]
    assert "+ts" not in paired  # temperature scaling keeps every prediction: its accuracy is its predictor's


def test_a_swag_run_fills_the_swa_columns_unless_a_swa_run_of_the_row_does(uncertainty_grid, tmp_path):
    report([uncertainty_grid], tmp_path / "out")
    assert cell_values(tmp_path / "out", "SWA 1.5B (6 ep)")[0]["mean"] == "82.500000"  # the SWAG runs' swa
    for seed in (0, 1):
        make_run(uncertainty_grid, "swa", seed, {"swa": m(70.0)}, budget=1.5)
    result = report([uncertainty_grid], tmp_path / "again")
    assert len(result["table"].rows) == 1  # not a second row for the SWAG runs' SWA
    assert cell_values(tmp_path / "again", "SWA 1.5B (6 ep)")[0]["mean"] == "70.000000"
    assert cell_values(tmp_path / "again", "SWA+ts 1.5B (6 ep)")[0]["mean"] == "82.500000"  # only SWAG's has a +ts


def test_the_ensemble_of_a_configs_seeds_is_the_mean_of_their_saved_probabilities(uncertainty_grid, tmp_path):
    result = report([uncertainty_grid], tmp_path / "out")
    by_label = {e.label: e for e in result["ensembles"]}
    assert set(by_label) == {"SGD 1B (4 ep) x2", "SWA 1.5B (6 ep) x2", "SWAG 1.5B (6 ep) x2",
                             "SWAG-diag 1.5B (6 ep) x2"}  # +ts columns are not ensembled
    members = [random_log_probs(30).half().float(), random_log_probs(31).half().float()]
    mean_probs = (members[0].double().exp() + members[1].double().exp()) / 2  # MultiSWAG, by hand
    expected = metrics_from_log_probs(mean_probs.log().float(), LABELS)
    got = by_label["SWAG 1.5B (6 ep) x2"].metrics
    assert got["acc"] == expected["acc"] and got["nll"] == pytest.approx(expected["nll"], rel=1e-5)
    assert got["brier"] == pytest.approx(expected["brier"], rel=1e-5)
    lines = table_lines(tmp_path / "out", "Ensembles of seeds (deep ensembles; SWAG x n is MultiSWAG)", 1)
    assert any(line.startswith("| cifar10 / preresnet20 | SWAG 1.5B (6 ep) x2 | 0, 1 | "
                               f"{expected['acc']:.2f} (83.50 ± 0.71) | {expected['nll']:.4f} (0.6500 ± 0.0000)")
               for line in lines), lines
    ensemble = [r for r in cell_values(tmp_path / "out", "SWAG 1.5B (6 ep) x2", "nll")]
    assert ensemble[0]["ensemble"] == "seeds" and ensemble[0]["seeds"] == "0 1" and ensemble[0]["n"] == "2"


def test_an_ensemble_that_cannot_be_formed_says_why(tmp_path):
    root = tmp_path / "grid"
    for seed, labels in ((0, LABELS), (1, LABELS.flip(0))):
        save_predictions(make_run(root, "sgd", seed, {"sgd": m(80.0)}), {"sgd": random_log_probs(seed)}, labels)
    for seed in (0, 1):
        make_run(root, "swa", seed, {"swa": m(81.0)}, budget=1.5)  # no predictions.pt
    save_predictions(make_run(root, "ema", 0, {"ema": m(80.0)}), {"ema": random_log_probs(5)})
    why = {e.label: e.why for e in report([root], tmp_path / "out")["ensembles"]}
    assert why["SGD 1B (4 ep) x2"] == "seed 1 was scored on other test labels than seed 0: not the same test set"
    assert why["SWA 1.5B (6 ep) x2"].startswith("seed 0: seed0 has no predictions.pt")
    assert why["EMA 1B (4 ep) x1"] == "one seed: an ensemble of seeds needs 2 or more"
    assert "## Ensembles of seeds" not in (tmp_path / "out" / "table.md").read_text()  # none formed: no section


def test_every_column_of_a_row_stands_on_a_line_with_its_temperature_and_paired_nll(uncertainty_grid, tmp_path):
    report([uncertainty_grid], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    block = text.split("### cifar10 / preresnet20\n\n")[1].split("\n\n")[0].splitlines()
    assert block[0] == "| column | n | accuracy % | NLL | ECE (15 equal-width bins) | Brier | T | Δ accuracy | Δ NLL |"
    sgd_ts = next(line for line in block if line.startswith("| SGD+ts 1B (4 ep) |"))
    assert sgd_ts.split(" | ")[6] == "2.000"  # the mean of the seeds' fitted temperatures, 1.5 and 2.5
    swa = next(line for line in block if line.startswith("| SWA 1.5B (6 ep) |"))
    assert swa.split(" | ")[3] == "0.8000 ± 0.0000" and swa.split(" | ")[-1] == "-0.1000 ± 0.0000 |"
    assert any(line.startswith("| SWAG 1.5B (6 ep) x2 | 2 (ensemble) |") for line in block)


def test_a_temperature_fitted_to_its_search_bound_is_marked_in_its_cells_and_explained_below_the_tables(tmp_path):
    root = tmp_path / "grid"
    for seed, at_bound in ((0, False), (1, True)):
        make_run(root, "sgd", seed, {"sgd": m(80.0), "sgd+ts": m(80.0, nll=0.7, temperature=0.01 if at_bound else 1.5,
                                                                 temperature_at_bound=at_bound)})
    make_run(root, "swa", 0, {"swa": m(82.0), "swa+ts": m(82.0, temperature=1.2, temperature_at_bound=False)},
             budget=1.5)
    report([root], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    row = table_lines(tmp_path / "out", "Test NLL (mean per image)")[2].split(" | ")
    assert row[2].endswith("0.7000 ± 0.0000 (n=2) · T at its search bound in 1 of 2 seeds*")  # SGD+ts
    assert "search bound" not in row[4]                                                    # SWA+ts: a fit inside
    assert text.count("* T at its search bound: ") == 1 and ("\n* T at its search bound: the validation split "
                                                              "(dataset.val_size) had no NLL minimum inside the "
                                                              "temperatures searched (0.01 to 100)") in text
    every = next(line for line in text.splitlines() if line.startswith("| SGD+ts 1B (4 ep) | 2 |"))
    assert every.split(" | ")[6] == "0.755*"
    clean = tmp_path / "clean"
    make_run(clean, "swa", 0, {"swa": m(82.0), "swa+ts": m(82.0, temperature=1.2, temperature_at_bound=False)})
    report([clean], tmp_path / "out2")
    assert "search bound" not in (tmp_path / "out2" / "table.md").read_text()


def test_reliability_diagrams_give_ece_and_brier_and_draw_the_columns_asked_for(uncertainty_grid, tmp_path,
                                                                                  monkeypatch):
    legends = {}  # per figure file, the legend of its first panel (drawn on one of that panel's axes)
    real = style.finish

    def keep_legend(plt, fig, path):
        legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
        legends[path.name] = [t.get_text() for t in legend.get_texts()]
        real(plt, fig, path)

    monkeypatch.setattr(style, "finish", keep_legend)
    report([uncertainty_grid], tmp_path / "out", reliability=["sgd", "swa", "swag", "fge"])
    legend = legends["reliability.png"]
    assert legend == ["perfect calibration", "SGD 1B (4 ep) (n=2, ECE 0.050, Brier 0.250)",
                      "SWA 1.5B (6 ep) (n=2, ECE 0.050, Brier 0.250)", "SWAG 1.5B (6 ep) (n=2, ECE 0.050, Brier 0.250)"]
    report([uncertainty_grid], tmp_path / "all")
    legend = legends["reliability.png"]
    assert not any("+ts" in t for t in legend) and len(legend) == 5  # every column but the +ts ones


def test_reliability_columns_take_each_methods_largest_budget():
    class Row:
        cells = {Column("swa", 1.0, 4): None, Column("swa", 1.5, 6): None, Column("sgd", 1.0, 4): None,
                 Column("swa+ts", 1.5, 6): None}

    assert plots.reliability_columns(Row, ["swa", "sgd", "fge", "swa+ts"]) == [
        Column("swa", 1.5, 6), Column("sgd", 1.0, 4), Column("swa+ts", 1.5, 6)]
    assert plots.reliability_columns(Row, None) == [Column("sgd", 1.0, 4), Column("swa", 1.0, 4), Column("swa", 1.5, 6)]


def test_the_report_names_a_reliability_choice_that_matches_no_column(uncertainty_grid, tmp_path, capsys):
    assert main([str(uncertainty_grid), "--out", str(tmp_path / "out"), "--reliability", "ema"]) == 0
    assert "--reliability ema: no column of these methods" in capsys.readouterr().out
    assert not (tmp_path / "out" / "reliability.png").exists()


def test_a_column_label_says_it_is_temperature_scaled():
    assert Column("swag_diag+ts", 1.5, 45).label == "SWAG-diag+ts 1.5B (45 ep)"
    assert sorted([Column("swa+ts", 1.0, 30), Column("swa", 1.25, 38), Column("swa", 1.0, 30)],
                  key=lambda c: c.order) == [Column("swa", 1.0, 30), Column("swa+ts", 1.0, 30), Column("swa", 1.25, 38)]


def test_a_column_and_its_temperature_scaled_twin_are_told_apart_in_the_reliability_diagram(uncertainty_grid, tmp_path,
                                                                                            monkeypatch):
    """SWA and SWA+ts share SWA's colour: the +ts curve is dashed (and its share of images too), so the two curves
    and their legend lines differ."""
    figures, real = {}, style.finish
    monkeypatch.setattr(style, "finish", lambda plt, fig, path: (figures.setdefault(path.name, fig),
                                                                  real(plt, fig, path)))
    report([uncertainty_grid], tmp_path / "out", reliability=["swa", "swa+ts"])
    panel = figures["reliability.png"].axes[0]
    drawn = {line.get_label().split(" (n=")[0]: line for line in panel.get_lines() if "(n=" in line.get_label()}
    assert set(drawn) == {"SWA 1.5B (6 ep)", "SWA+ts 1.5B (6 ep)"}
    swa, scaled = drawn["SWA 1.5B (6 ep)"], drawn["SWA+ts 1.5B (6 ep)"]
    assert swa.get_color() == scaled.get_color() and swa.get_linestyle() == "-" and scaled.get_linestyle() == "--"
