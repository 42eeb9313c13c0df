"""``python -m swalab.report``: the paper-style table, CSVs and plots from run directories on disk."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from swalab.report import main, report

BINS = [{"lo": i / 15, "hi": (i + 1) / 15, "count": 10 if i > 10 else 0, "acc": 0.8 if i > 10 else None,
         "conf": (i + 0.5) / 15 if i > 10 else None} for i in range(15)]


def make_run(root, method, seed, metrics, budget=1.0, dataset="cifar10", model="preresnet20", status="complete",
             history=None, lineage=None):
    run = root / dataset / model / method / "default" / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"seed": seed, "dataset": {"name": dataset}, "model": {"name": model},
         "method": {"name": method, "budget": budget}}))
    (run / "status.json").write_text(json.dumps(
        {"status": status, **({"error": "NonFiniteLossError: the training loss became NaN"} if status == "failed"
                              else {})}))
    if status == "complete":
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "reliability.json").write_text(json.dumps({name: BINS for name in metrics}))
    rows = history or [{"epoch": e, "test_acc": 50.0 + e} for e in (1, 2)]
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if lineage:
        (run / "lineage.json").write_text(json.dumps(lineage))
    return run


@pytest.fixture
def grid(tmp_path):
    root = tmp_path / "grid"
    for seed, (sgd, swa, swa1, fge, ema) in enumerate([(90.0, 92.0, 91.0, 91.5, 90.5), (92.0, 94.0, 93.0, 92.5, 91.5)]):
        make_run(root, "sgd", seed, {"sgd": {"acc": sgd}})
        make_run(root, "swa", seed, {"swa": {"acc": swa}, "swa@1": {"acc": swa1}, "sgd": {"acc": 10.0}}, budget=1.5,
                 history=[{"epoch": 1, "test_acc": 60.0}, {"epoch": 2, "test_acc": 70.0, "swa_test_acc": 72.0}])
        make_run(root, "fge", seed, {"fge": {"acc": fge, "curve": [{"members": 1, "acc": 80.0},
                                                                   {"members": 2, "acc": fge}]}})
        make_run(root, "ema", seed, {"ema": {"acc": ema}})
    make_run(root, "swa", 7, {}, budget=1.5, status="failed")
    return root


def test_cells_are_mean_and_std_over_seeds_in_the_papers_column_order(grid, tmp_path):
    result = report([grid], tmp_path / "out")
    table = (tmp_path / "out" / "table.md").read_text()
    header = table.splitlines()[0]
    assert header == "| dataset | model | SGD | FGE (1B) | SWA 1B | SWA 1.5B | EMA (1B) |"
    row = table.splitlines()[2]
    assert row == ("| cifar10 | preresnet20 | 91.00 ± 1.41 (n=2) | 92.00 ± 0.71 (n=2) | 92.00 ± 1.41 (n=2) "
                   "| 93.00 ± 1.41 (n=2) | 91.00 ± 0.71 (n=2) |")
    assert len(result["finished"]) == 8


def test_the_last_iterate_of_a_swa_run_is_not_counted_as_the_sgd_baseline(grid, tmp_path):
    report([grid], tmp_path / "out")
    with (tmp_path / "out" / "table.csv").open() as f:
        sgd = next(r for r in csv.DictReader(f) if r["column"] == "SGD")
    assert sgd["values"] == "90.0000 92.0000"


def test_failed_runs_are_listed_not_dropped(grid, tmp_path, capsys):
    assert main([str(grid), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "failed:" in printed and "seed7" in printed and "NonFiniteLossError" in printed
    assert "seed7" in (tmp_path / "out" / "table.md").read_text().split("## Not in the table")[1]
    with (tmp_path / "out" / "runs.csv").open() as f:
        statuses = [r["status"] for r in csv.DictReader(f)]
    assert statuses.count("failed") == 1 and statuses.count("complete") == 8


def test_plots_are_written_as_png(grid, tmp_path):
    written = report([grid], tmp_path / "out")["written"]
    for name in ("test_error.png", "fge_curve.png", "reliability.png"):
        assert written[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paper_numbers_are_shown_beside_ours_when_asked(tmp_path):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": {"acc": 70.0}}, dataset="cifar100", model="vgg16")
    report([tmp_path / "g"], tmp_path / "out", paper=True)
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| cifar100 | vgg16 (paper) | 72.55 ± 0.10 |" in table
    assert "| cifar100 | vgg16 | 70.00 (n=1) |" in table


def test_lineage_is_footnoted(tmp_path):
    make_run(tmp_path / "g", "swa", 0, {"swa": {"acc": 80.0}}, lineage={"parent": "/runs/sgd/seed0", "epoch": 100})
    table = report([tmp_path / "g"], tmp_path / "out")["written"]["table.md"].read_text()
    assert table.splitlines()[0].endswith("| lineage |") and "[1]" in table.splitlines()[2]
    assert "[1] SWA 1B seed 0 from /runs/sgd/seed0 (epoch 100)" in table


def test_mixing_datasets_is_said_and_each_keeps_its_own_row(tmp_path, capsys):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": {"acc": 70.0}}, dataset="cifar100")
    make_run(tmp_path / "g", "sgd", 0, {"sgd": {"acc": 90.0}}, dataset="cifar10")
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "the runs mix 2 datasets (cifar10, cifar100)" in out
    assert "| cifar10 | preresnet20 | 90.00 (n=1) |" in out and "| cifar100 | preresnet20 | 70.00 (n=1) |" in out


def test_a_directory_without_finished_runs_says_so(tmp_path, capsys):
    make_run(tmp_path / "g", "sgd", 0, {}, status="running")
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "no finished runs" in captured.err and "running:" in captured.out
    assert not (tmp_path / "out" / "table.md").exists()


def test_a_missing_directory_is_an_error_not_an_empty_table(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err
