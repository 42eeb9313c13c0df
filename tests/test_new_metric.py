"""Adding a metric is one entry in ``swalab.evaluate.METRICS``: every predictor is then scored by it, and the report's
tables, its CSV, its ensembles of seeds and the W&B mirror show it, with no other edit.

The metric here, the mean confidence (the largest probability per image, in %), is added for the length of a test,
as a user's ``METRICS["confidence"] = Metric(...)`` would be; two SGD seeds with saved predictions are then
scored, reported and mirrored.
"""

from __future__ import annotations

import csv

import pytest
import torch
import wandb
from test_report import make_run
from test_tracking import FakeRun

from swalab.evaluate import METRICS, Metric, metrics_from_log_probs
from swalab.results.report import report
from swalab.tracking import WandbTracker

CONFIDENCE = Metric("confidence", "Test mean confidence (%)", "confidence %", digits=2,
                    compute=lambda log_probs, labels: 100.0 * float(log_probs.exp().max(dim=1).values.mean()))


@pytest.fixture
def confidence(monkeypatch):
    monkeypatch.setitem(METRICS, "confidence", CONFIDENCE)


def seeds_with_predictions(root):
    """Two SGD seeds as a run writes them: metrics.json from ``metrics_from_log_probs``, and predictions.pt."""
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    runs = []
    for seed in (0, 1):
        log_probs = torch.randn(6, 3, generator=torch.Generator().manual_seed(seed)).log_softmax(dim=1)
        run = make_run(root, "sgd", seed, {"sgd": metrics_from_log_probs(log_probs, labels)})
        torch.save({"log_probs": {"sgd": log_probs.half()}, "labels": labels}, run / "predictions.pt")
        runs.append((run, log_probs))
    return runs, labels


def test_a_metric_added_in_one_place_is_computed_for_every_predictor(confidence):
    log_probs = torch.tensor([[0.9, 0.1], [0.4, 0.6]]).log()
    assert metrics_from_log_probs(log_probs, torch.tensor([0, 0]))["confidence"] == pytest.approx(75.0)


def test_a_metric_added_in_one_place_has_its_table_its_csv_lines_and_its_ensemble_column(confidence, tmp_path):
    runs, labels = seeds_with_predictions(tmp_path / "runs")
    report([tmp_path / "runs"], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    own = [metrics_from_log_probs(log_probs, labels)["confidence"] for _, log_probs in runs]
    mean = sum(own) / 2
    assert "## Test mean confidence (%)" in text
    table = text.split("## Test mean confidence (%)\n\n")[1].split("\n\n")[0].splitlines()
    assert table[2].startswith(f"| cifar10 / preresnet20 | {mean:.2f} ± ")
    with (tmp_path / "out" / "table.csv").open() as f:
        lines = [r for r in csv.DictReader(f) if r["metric"] == "confidence"]
    assert [(r["ensemble"], float(r["mean"])) for r in lines][0] == ("", pytest.approx(mean, abs=1e-6))
    assert [r["ensemble"] for r in lines] == ["", "seeds"]
    ensembles = text.split("## Ensembles of seeds")[1].split("\n\n")[2].splitlines()
    assert ensembles[0].endswith("| Brier | confidence % |")
    assert ensembles[2].endswith(f" ({mean:.2f} ± {abs(own[0] - own[1]) / 2 ** 0.5:.2f}) |")


def test_a_metric_added_in_one_place_is_mirrored_to_wandb(confidence, tmp_path, monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    tracker = WandbTracker(project="p", run_dir=tmp_path, run_config={})
    metrics = metrics_from_log_probs(torch.tensor([[0.9, 0.1], [0.4, 0.6]]).log(), torch.tensor([0, 0]))
    tracker.results({"fge": {**metrics, "curve": [{"members": 1, **metrics}]}}, {})
    assert run.summary["fge/confidence"] == pytest.approx(75.0)
    [charts] = run.logged
    assert charts["fge/curve"].table.columns[-1] == "confidence"
    assert charts["fge/curve"].table.data[0][-1] == pytest.approx(75.0)
