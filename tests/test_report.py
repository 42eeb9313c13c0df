"""``python -m swalab.results.report``: tables that never mix or double-count runs, CSVs and plots from run directories."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import yaml

from swalab.results.report import main, report

BINS = [{"lo": i / 15, "hi": (i + 1) / 15, "count": 10 if i > 10 else 0, "acc": 0.8 if i > 10 else None,
         "conf": (i + 0.5) / 15 if i > 10 else None} for i in range(15)]
B = 4  # the budget in epochs of every fake run below


def make_run(root, method, seed, metrics, budget=1.0, dataset="cifar10", model="preresnet20", status="complete",
             history=None, lineage=None, name="default", extra=None):
    """A run directory as swalab writes it; ``extra`` adds identity keys (``{"trainer": {"batch_size": 64}}``)."""
    run = root / dataset / model / method / name / f"seed{seed}"
    run.mkdir(parents=True)
    config = {"seed": seed, "dataset": {"name": dataset}, "model": {"name": model},
              "method": {"name": method, "budget": budget}, "trainer": {"epochs": round(budget * B)}}
    for group, values in (extra or {}).items():
        config.setdefault(group, {}).update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
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


def m(acc, nll=0.5, ece=0.05, **more):
    return {"acc": acc, "nll": nll, "ece": ece, **more}


@pytest.fixture
def grid(tmp_path):
    root = tmp_path / "grid"
    for seed, (sgd, swa, swa1, fge, ema) in enumerate([(90.0, 92.0, 91.0, 91.5, 90.5), (92.0, 94.0, 93.0, 92.5, 91.5)]):
        make_run(root, "sgd", seed, {"sgd": m(sgd)})
        make_run(root, "swa", seed, {"swa": m(swa), "swa@1": m(swa1, budget=1.0, epoch=4), "sgd": m(10.0)},
                 budget=1.5, history=[{"epoch": 1, "test_acc": 60.0}, {"epoch": 2, "test_acc": 70.0,
                                                                        "swa_test_acc": 72.0}])
        make_run(root, "fge", seed, {"fge": m(fge, curve=[{"members": 1, "acc": 80.0}, {"members": 2, "acc": fge}])})
        make_run(root, "ema", seed, {"ema": m(ema)})
    make_run(root, "swa", 7, {}, budget=1.5, status="failed")
    return root


def table_lines(path, title="Test accuracy (%)", paragraph=0):
    text = (path / "table.md").read_text()
    section = text.split(f"## {title}\n\n")[1].split("\n\n")[paragraph]
    return section.splitlines()


def cell_values(path, column, metric="acc", row=None):
    with (path / "table.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["column"] == column and r["metric"] == metric
                and (row is None or r["row"] == row)]


def test_cells_are_mean_and_std_over_seeds_with_budget_and_epochs_in_each_column(grid, tmp_path):
    result = report([grid], tmp_path / "out")
    header, _, row = table_lines(tmp_path / "out")
    assert header == "| row | SGD 1B (4 ep) | FGE 1B (4 ep) | SWA 1B (4 ep) | SWA 1.5B (6 ep) | EMA 1B (4 ep) |"
    assert row == ("| cifar10 / preresnet20 | 91.00 ± 1.41 (n=2) | 92.00 ± 0.71 (n=2) | 92.00 ± 1.41 (n=2) "
                   "| 93.00 ± 1.41 (n=2) | 91.00 ± 0.71 (n=2) |")
    assert len(result["finished"]) == 8


def test_nll_and_ece_tables_stand_beside_accuracy(grid, tmp_path):
    report([grid], tmp_path / "out")
    assert table_lines(tmp_path / "out", "Test NLL (mean per image)")[2].startswith(
        "| cifar10 / preresnet20 | 0.5000 ± 0.0000 (n=2) |")
    assert len(table_lines(tmp_path / "out", "Test ECE (15 equal-width bins, Guo et al.)")) == 3


def test_paired_differences_against_sgd_are_per_seed(grid, tmp_path):
    report([grid], tmp_path / "out")
    header, _, row = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", 1)
    assert header.startswith("| row | FGE 1B (4 ep) − SGD |")
    assert "+2.00 ± 0.00 (+2.00, +2.00)" in row  # SWA 1.5B − SGD: 92 − 90 and 94 − 92
    assert "+1.00 ± 0.71 (+1.50, +0.50)" in row  # FGE − SGD: 91.5 − 90 and 92.5 − 92


def test_each_column_is_paired_with_the_sgd_run_of_its_own_budget(tmp_path):
    """Two grids of different lengths share a row: SWA 1.5B (6 ep) has B = 4 and is set against SGD 1B (4 ep),
    SWA 1.5B (3 ep) has B = 2 and is set against SGD 1B (2 ep), whatever the order the runs are found in."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(80.0, epoch=2)}, name="short", extra={"trainer": {"epochs": 2}})
    make_run(root, "swa", 0, {"swa": m(85.0, epoch=3)}, budget=1.5, name="short", extra={"trainer": {"epochs": 3}})
    make_run(root, "sgd", 0, {"sgd": m(90.0, epoch=4)})
    make_run(root, "swa", 0, {"swa": m(93.0, epoch=6)}, budget=1.5)
    report([root], tmp_path / "out")
    header, _, row = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", 1)
    assert header == "| row | SWA 1.5B (3 ep, B = 2) − SGD | SWA 1.5B (6 ep, B = 4) − SGD |"  # two Bs: each said
    assert row == "| cifar10 / preresnet20 | +5.00 (+5.00) | +3.00 (+3.00) |"


def test_the_last_iterate_of_a_swa_run_is_not_counted_as_the_sgd_baseline(grid, tmp_path):
    report([grid], tmp_path / "out")
    [sgd] = cell_values(tmp_path / "out", "SGD 1B (4 ep)")
    assert sgd["values"] == "90.000000 92.000000" and sgd["seeds"] == "0 1"


def test_a_second_grid_never_double_counts_a_run_of_the_first(grid, tmp_path, capsys):
    """The same SGD runs in a second grid's directories (an SWA-only override changes nothing for SGD) count once."""
    second = tmp_path / "grid2"
    for seed, acc in enumerate((90.0, 92.0)):
        make_run(second, "sgd", seed, {"sgd": m(acc)}, name="model.swa.lr-0.05")
        make_run(second, "swa", seed, {"swa": m(95.0 + seed)}, budget=1.5, name="model.swa.lr-0.05",
                 extra={"method": {"swa_lr": 0.05}})
    assert main([str(grid), str(second), "--out", str(tmp_path / "out")]) == 0
    [sgd] = cell_values(tmp_path / "out", "SGD 1B (4 ep)")
    assert sgd["n"] == "2" and sgd["seeds"] == "0 1"
    assert "repeats" in capsys.readouterr().out  # the duplicates are listed, not silently merged
    rows = [line.split(" | ")[0] for line in table_lines(tmp_path / "out")[2:]]
    # runs without a record of the keys typed (no identity.json) are labelled by their identity's keys
    assert rows == ["| cifar10 / preresnet20", "| cifar10 / preresnet20 · method.lr=0.05"]
    [swa_05] = cell_values(tmp_path / "out", "SWA 1.5B (6 ep)", row="cifar10 / preresnet20 · method.lr=0.05")
    assert swa_05["values"] == "95.000000 96.000000"


def test_runs_of_different_lengths_or_settings_are_never_pooled(tmp_path):
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(40.0)}, name="e2", extra={"trainer": {"epochs": 2}})
    make_run(root, "sgd", 0, {"sgd": m(80.0)}, name="e4", extra={"trainer": {"epochs": 4}})
    make_run(root, "sgd", 1, {"sgd": m(60.0)}, name="bs", extra={"trainer": {"batch_size": 64}})
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out")
    assert lines[0] == "| row | SGD 1B (2 ep, B = 2) | SGD 1B (4 ep, B = 4) |"  # two Bs: each said
    assert lines[2:] == ["| cifar10 / preresnet20 · trainer.batch_size=– | 40.00 (n=1) | 80.00 (n=1) |",
                         "| cifar10 / preresnet20 · trainer.batch_size=64 | not run | 60.00 (n=1) |"]


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
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)}, dataset="cifar100", model="vgg16")
    report([tmp_path / "g"], tmp_path / "out", paper=True)
    lines = table_lines(tmp_path / "out")
    assert lines[2:] == ["| cifar100 / vgg16 | 70.00 (n=1) |", "| cifar100 / vgg16 (paper) | 72.55 ± 0.10 |"]


def test_paper_asked_of_runs_the_paper_has_no_row_for_prints_no_paper_rows_footnote_but_says_so(tmp_path):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(98.0)}, dataset="digits", model="preresnet20")
    report([tmp_path / "g"], tmp_path / "out", paper=True)
    text = (tmp_path / "out" / "table.md").read_text()
    assert "Paper rows:" not in text and "(paper)" not in text
    assert "--paper: the paper has no row of digits / preresnet20" in text
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)}, dataset="cifar100", model="vgg16")
    report([tmp_path / "g"], tmp_path / "out", paper=True)
    assert "Paper rows:" in (tmp_path / "out" / "table.md").read_text()  # a row shown: its source said


def test_branched_runs_are_named_under_the_table(tmp_path):
    make_run(tmp_path / "g", "swa", 0, {"swa": m(80.0)},
             lineage={"kind": "branch", "parent": "/runs/sgd/seed0", "epoch": 100})
    table = report([tmp_path / "g"], tmp_path / "out")["written"]["table.md"].read_text()
    assert "- cifar10 / preresnet20 · SWA 1B (4 ep), seed 0: branched from .../runs/sgd/seed0 at epoch 100" in table


def test_a_branched_run_is_named_by_its_row_and_columns_apart_from_the_settings_the_row_names(tmp_path):
    """The row tool's SWA branch of model.swa.pre_schedule=base stands in SGD's row, whose name ends with its
    setting: the columns a branched run fills never read as a part of that setting."""
    root = tmp_path / "g"
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    with_apart(make_run(root, "fge", 0, {"fge": m(91.0)}, lineage={"kind": "branch", "parent": "/runs/sgd/seed0",
                                                                   "epoch": 3}), {})
    with_apart(make_run(root, "swa", 0, {"swa": m(92.0)}, budget=1.5, extra={"method": {"pre_schedule": "base"}},
                        lineage={"kind": "branch", "parent": "/runs/sgd/seed0", "epoch": 2}),
               {"model.swa.pre_schedule": "base"})
    table = report([root], tmp_path / "out")["written"]["table.md"].read_text()
    lines = [line for line in table.splitlines() if "branched from" in line]
    assert lines == ["- cifar10 / preresnet20 · SWA: model.swa.pre_schedule=base · FGE 1B (4 ep), seed 0: branched from "
                     ".../runs/sgd/seed0 at epoch 3",
                     "- cifar10 / preresnet20 · SWA: model.swa.pre_schedule=base · SWA 1.5B (6 ep), seed 0: branched "
                     "from .../runs/sgd/seed0 at epoch 2"]


def test_a_run_started_from_another_runs_weights_is_not_called_branched(tmp_path):
    """``model.init_from`` records where the weights came from (no ``kind``: swalab.branching writes ``branch`` for
    a branch alone); such a run did not continue its parent's training and is not listed as branched."""
    make_run(tmp_path / "g", "swa", 0, {"swa": m(80.0)}, lineage={"parent": "/runs/sgd/seed0", "epoch": 30})
    table = report([tmp_path / "g"], tmp_path / "out")["written"]["table.md"].read_text()
    assert "branched from" not in table


def test_a_parent_that_shares_nothing_with_the_run_is_shown_as_its_own_tail_marked_elided(tmp_path):
    """Runs moved from the machine they ran on (a GPU machine's /tmp) keep their parents' paths there: the report shows
    the parent's <dataset>/<model>/<method>/<settings>/seed<N>, marked as cut, never a path that reads as relative."""
    from swalab.results.write import shown_parent

    parent = "/tmp/shift/runs/cifar10/preresnet20/sgd/default/seed0"
    assert shown_parent(tmp_path / "runs" / "cifar10" / "preresnet20" / "swa" / "x" / "seed0", parent) == \
        ".../cifar10/preresnet20/sgd/default/seed0"


def test_mixing_datasets_is_said_and_each_keeps_its_own_row(tmp_path, capsys):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)}, dataset="cifar100")
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(90.0)}, dataset="cifar10")
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "the runs mix 2 datasets (cifar10, cifar100)" in out
    assert "| cifar10 / preresnet20 | 90.00 (n=1) |" in out and "| cifar100 / preresnet20 | 70.00 (n=1) |" in out


def section(text, heading):
    """The text of ``table.md`` under ``heading`` (a ``## `` line) up to the next ``## `` heading."""
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def markdown_tables(text):
    """The lines of the markdown tables in ``text``."""
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def test_a_report_over_two_datasets_has_one_table_per_dataset_and_model_each_with_only_its_own_columns(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path / "g", "sgd", seed, {"sgd": m(90.0 + seed)}, dataset="cifar10")
        make_run(tmp_path / "g", "swa", seed, {"swa": m(92.0 + seed)}, budget=1.5, dataset="cifar10")
        make_run(tmp_path / "g", "sgd", seed, {"sgd": m(70.0 + seed)}, dataset="cifar100", model="vgg16")
        make_run(tmp_path / "g", "fge", seed, {"fge": m(72.0 + seed)}, dataset="cifar100", model="vgg16")
        make_run(tmp_path / "g", "ema", seed, {"ema": m(71.0 + seed)}, dataset="cifar100", model="vgg16")
    text = "\n" + report([tmp_path / "g"], tmp_path / "out")["written"]["table.md"].read_text()
    assert text.startswith("\n## cifar10 / preresnet20\n") and "\n## cifar100 / vgg16\n" in text
    cifar10, cifar100 = section(text, "## cifar10 / preresnet20"), section(text, "## cifar100 / vgg16")
    assert "| row | SGD 1B (4 ep) | SWA 1.5B (6 ep) |" in cifar10
    assert "| cifar10 / preresnet20 | 90.50 ± 0.71 (n=2) | 92.50 ± 0.71 (n=2) |" in cifar10
    assert "| row | SGD 1B (4 ep) | FGE 1B (4 ep) | EMA 1B (4 ep) |" in cifar100
    for part in (cifar10, cifar100):
        assert "not run" not in markdown_tables(part)
        assert "### Test accuracy (%)" in part and "### Paired differences against SGD" in part
    assert "FGE" not in markdown_tables(cifar10) and "SWA" not in markdown_tables(cifar100)


def test_a_report_over_one_dataset_and_model_keeps_one_table_under_the_metric_headings(grid, tmp_path):
    text = report([grid], tmp_path / "out")["written"]["table.md"].read_text()
    assert text.startswith("## Test accuracy (%)\n") and "## cifar10 / preresnet20\n" not in text


def test_a_grid_record_reports_exactly_its_own_runs(grid, tmp_path):
    from swalab.grid import record_job

    record = tmp_path / "outputs" / "grids" / "2026-11-23_10-00-00"
    record_job(record, 0, ["method=sgd", "seed=0"], grid / "cifar10/preresnet20/sgd/default/seed0", "complete")
    record_job(record, 1, ["method=sgd", "seed=1"], grid / "cifar10/preresnet20/sgd/default/seed1", "complete")
    result = report([record], tmp_path / "out")
    assert sorted(r.path.name for r in result["runs"]) == ["seed0", "seed1"]
    [sgd] = cell_values(tmp_path / "out", "SGD 1B (4 ep)")
    assert sgd["n"] == "2"


def test_a_directory_without_finished_runs_says_so(tmp_path, capsys):
    make_run(tmp_path / "g", "sgd", 0, {}, status="running")
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "no finished runs" in captured.err and "running:" in captured.out
    assert not (tmp_path / "out" / "table.md").exists()


def test_a_directory_without_finished_runs_leaves_the_earlier_report_as_it_was(grid, tmp_path, capsys):
    out = tmp_path / "report"
    report([grid], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    make_run(tmp_path / "g", "sgd", 0, {}, status="running")
    assert main([str(tmp_path / "g"), "--out", str(out)]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no file replaced, none deleted
    assert f"nothing to report; the earlier report in {out} is left as it was" in capsys.readouterr().err


def test_a_report_removes_the_work_folder_a_killed_report_left_and_keeps_a_live_ones(grid, tmp_path):
    import os

    out = tmp_path / "report"
    abandoned = tmp_path / ".report.999999999.x1y2"  # no process has this id
    live = tmp_path / f".report.{os.getpid()}.z3"    # a report still running in this process
    for folder in (abandoned, live):
        folder.mkdir()
        (folder / "table.csv").write_text("half")
    report([grid], out)
    assert not abandoned.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".report.")) == [live.name]


def test_a_missing_directory_is_an_error_not_an_empty_table(tmp_path, capsys):
    from swalab.cli import run_command

    with pytest.raises(SystemExit) as exit_:
        run_command(main, [str(tmp_path / "nowhere")], prog="swalab.results.report")
    assert exit_.value.code == 2 and "no such directory" in capsys.readouterr().err


def test_section_35_compares_swa_with_the_fge_ensemble_per_seed_from_saved_probabilities(tmp_path):
    import torch

    from swalab.results.diagnostics import label_agreement, mean_prob_l2

    root = tmp_path / "g"
    labels = torch.tensor([0, 1, 2, 1])
    expected = {"consecutive": [], "swa": []}
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        members = [torch.rand(4, 3, generator=g).softmax(1) for _ in range(3)]
        swa = torch.rand(4, 3, generator=g).softmax(1)
        fge_run = make_run(root, "fge", seed, {"fge": m(90.0)})
        torch.save({"member_log_probs": [p.log() for p in members], "member_epochs": [1, 2, 3], "labels": labels},
                   fge_run / "fge_member_probs.pt")
        swa_run = make_run(root, "swa", seed, {"swa": m(91.0)}, budget=1.5)
        torch.save({"probs": {"swa": swa.half()}, "log_probs": {"swa": swa.log().half()}, "labels": labels},
                   swa_run / "predictions.pt")
        expected["consecutive"].append(sum(mean_prob_l2(a, b) for a, b in zip(members, members[1:])) / 2)
        expected["swa"].append((mean_prob_l2(swa.half().float(), torch.stack(members).mean(0)),
                                label_agreement(swa.half().float(), torch.stack(members).mean(0))))
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Section 3.5: SWA against the FGE ensemble", 1)
    consecutive, versus = lines[2].split(" | "), lines[3].split(" | ")
    assert consecutive[1] == "FGE 1B (4 ep): consecutive members"
    assert consecutive[2].startswith(f"{sum(expected['consecutive']) / 2:.4f} ± ")
    assert versus[1] == "SWA 1.5B (6 ep) vs the FGE 1B (4 ep) ensemble"
    assert versus[2].startswith(f"{sum(l2 for l2, _ in expected['swa']) / 2:.4f} ± ")
    assert versus[3].startswith(f"{sum(a for _, a in expected['swa']) / 2:.2f}")


def test_without_wandb_workspaces_the_report_works_and_wandb_says_what_to_install(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)})
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports", None)
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out")]) == 0
    assert main([str(tmp_path / "g"), "--out", str(tmp_path / "out2"), "--wandb"]) == 2
    assert "pip install 'wandb-workspaces>=0.4'" in capsys.readouterr().err


def epochs(first, last, seconds):
    return [{"epoch": e, "test_acc": 50.0, "seconds": seconds} for e in range(first, last + 1)]


def test_the_wall_time_of_branched_rows_is_set_against_the_naive_runs(tmp_path):
    """The times come from the runs' histories: the SWA branch (from SGD epoch 2) counts only its own
    epochs 3-6, and a row finished over two launches (this record says the last launch skipped both
    jobs) still counts every epoch its runs trained."""
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(90.0, epoch=4)}, history=epochs(1, 4, 10.0))
    make_run(root, "swa", 0, {"swa": m(92.0, epoch=6), "swa@1": m(91.0, budget=1.0, epoch=4)}, budget=1.5,
             history=epochs(1, 2, 10.0) + epochs(3, 6, 7.5))
    sgd, swa = "cifar10/preresnet20/sgd/default/seed0", "cifar10/preresnet20/swa/default/seed0"
    record = {"seed": 0, "naive": False,
              "jobs": [{"name": "sgd", "run_dir": sgd, "branch_epoch": None},
                       {"name": "swa", "run_dir": swa, "branch_epoch": 2}],
              "columns": {"SGD": {"run": sgd, "predictor": "sgd"}, "SWA 1B": {"run": swa, "predictor": "swa@1"},
                          "SWA 1.5B": {"run": swa, "predictor": "swa"}},
              "launch": [{"name": "sgd", "skipped": True, "seconds": 0.0, "epochs_trained": 0},
                         {"name": "swa", "skipped": True, "seconds": 0.0, "epochs_trained": 0}]}
    (root / "rows").mkdir()
    (root / "rows" / "cifar10_preresnet20_seed0.json").write_text(json.dumps(record))
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Wall time of the branched rows", 1)
    # 8 epochs in 4 x 10 + 4 x 7.5 = 70 s (8.75 s an epoch) against 4 + 4 + 6 = 14 epochs: 122.5 s
    assert lines[2] == "| 0 | 8 | 1.2 | 14 | 2.0 | 1.75x |"

def test_a_report_into_a_folder_of_an_earlier_one_leaves_none_of_its_files(grid, tmp_path):
    """The FGE curve of an earlier report (of runs with FGE) must not pass for this report's."""
    report([grid], tmp_path / "out")
    assert (tmp_path / "out" / "fge_curve.png").exists()
    root = tmp_path / "sgd_only"
    make_run(root, "sgd", 0, {"sgd": m(90.0, epoch=4)})
    written = report([root], tmp_path / "out")["written"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(written)
    assert not (tmp_path / "out" / "fge_curve.png").exists()


def test_a_report_that_fails_midway_leaves_the_earlier_report_whole(grid, tmp_path, monkeypatch):
    import swalab.results.report as report_mod

    out = tmp_path / "report"
    report([grid], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what a kill or Ctrl-C while the plots are drawn does to the command
    monkeypatch.setattr(report_mod, "plot_reliability", killed)
    with pytest.raises(KeyboardInterrupt):
        report([grid], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing half-written, nothing deleted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.")]  # no work folder left behind


@pytest.mark.parametrize("args, line", [
    (["--out", "afile"], "--out afile is a file: give a folder"),
    (["--out", "afile/sub"], "--out afile/sub lies below afile, which is a file: give a folder"),
])
def test_bad_flags_of_report_and_row_are_one_line(grid, tmp_path, args, line):
    import subprocess

    (tmp_path / "afile").write_text("")
    done = subprocess.run([sys.executable, "-m", "swalab.results.report", str(grid), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"[swalab.results.report] {line}"]


@pytest.mark.parametrize("args, line", [
    (["--dataset", "digits", "--model", "preresnet20", "--swa-budgets", "-1"],
     "--swa-budgets -1: every SWA budget must be a number > 0"),
    (["--dataset", "nosuch", "--model", "preresnet20"],
     "In 'config': Could not find 'dataset/nosuch'; available options in 'dataset': cifar10, cifar100, digits"),
])
def test_bad_arguments_of_row_are_one_line(tmp_path, args, line):
    import subprocess

    done = subprocess.run([sys.executable, "-m", "swalab.results.row", *args, f"paths.output_dir={tmp_path}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"[swalab.results.row] {line}")


def test_a_damaged_metrics_file_is_listed_by_name(grid, tmp_path, capsys):
    damaged = grid / "cifar10" / "preresnet20" / "ema" / "default" / "seed1" / "metrics.json"
    damaged.write_text("")
    found = report([grid], tmp_path / "report")
    assert any(n.startswith(f"damaged: {damaged.parent}") and "metrics.json cannot be read" in n
               for n in found["notes"])


def test_a_finished_run_whose_config_holds_no_config_is_listed_not_dropped(grid, tmp_path):
    """A config.yaml damaged into a list (and an identity.json into null) leaves the run out of every row: the report
    says which run, and the rest of the table stands."""
    run = grid / "cifar10" / "preresnet20" / "ema" / "default" / "seed1"
    (run / "config.yaml").write_text("- 1\n")
    (run / "identity.json").write_text(json.dumps({"identity": None}))
    found = report([grid], tmp_path / "report")
    assert f"damaged: {run}: config.yaml is missing or holds no config, so the run is in no row of the table" in \
        found["notes"]
    assert cell_values(tmp_path / "report", "EMA 1B (4 ep)")[0]["n"] == "1"


def with_apart(run, apart):
    """What run.py records of a run launched with overrides: what sets it apart from its defaults."""
    from swalab.compat import upgraded_config
    from swalab.identity import identity_of

    # the config as run.py writes it: a method's settings in method.*, read from the model's recipe block
    identity = identity_of(upgraded_config(yaml.safe_load((run / "config.yaml").read_text())))
    (run / "identity.json").write_text(json.dumps({"identity": identity, "apart": apart}))
    return run


def test_the_plain_row_holds_the_defaults_and_every_other_row_names_its_settings_as_typed(tmp_path):
    root = tmp_path / "g"
    with_apart(make_run(root, "swa", 0, {"swa": m(97.5)}, budget=1.5, name="lr05",
                        extra={"method": {"swa_lr": 0.05}}), {"model.swa.lr": 0.05, "model.swa.start_epoch": 3})
    with_apart(make_run(root, "swa", 0, {"swa": m(91.0)}, budget=1.5, name="lr005",
                        extra={"method": {"swa_lr": 0.005}}), {"model.swa.lr": 0.005, "model.swa.start_epoch": 5})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, budget=1.5, name="default"), {})
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}, name="default"), {})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == [
        "| cifar10 / preresnet20 | 90.00 (n=1) | 93.00 (n=1) |",  # the defaults, though lr 0.05 was run first
        "| cifar10 / preresnet20 · model.swa.lr=0.005, model.swa.start_epoch=5 | not run | 91.00 (n=1) |",
        "| cifar10 / preresnet20 · model.swa.lr=0.05, model.swa.start_epoch=3 | not run | 97.50 (n=1) |"]


def test_a_column_is_paired_only_with_sgd_of_exactly_its_budget_and_says_so_otherwise(tmp_path):
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(90.0)}, extra={"trainer": {"epochs": 6}})
    make_run(root, "swa", 0, {"swa": m(95.0)}, budget=1.5, extra={"trainer": {"epochs": 8}})  # B = 5.33, not 6
    make_run(root, "swa", 0, {"swa": m(94.0)}, budget=1.5, name="b6", extra={"trainer": {"epochs": 9}})  # B = 6
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", paragraph=1)
    assert lines[0] == "| row | SWA 1.5B (8 ep, B = 5.33) − SGD | SWA 1.5B (9 ep, B = 6) − SGD |"
    assert lines[2].endswith("| no SGD run of B = 5.33 ep | +4.00 (+4.00) |")
    text = (tmp_path / "out" / "table.md").read_text()
    assert "(SWA 1.5B (9 ep) − SGD 1B (6 ep))" in text  # the caption's example is a pair of this table


def test_runs_that_differ_only_in_what_they_measure_never_share_a_row_name(tmp_path):
    """model.swa.score_every only adds measurements and is left out of labels (the row tool scores SWA beside its
    SGD row), but two runs that differ in nothing else are two configs: each row says which it is."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, budget=1.5, name="scored",
                        extra={"method": swa, "model": {"swa": {"score_every": 1}}}), {"model.swa.score_every": 1})
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, budget=1.5, name="default", extra={"method": swa}), {})
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    for start in (0.5,):  # and two of one other setting
        with_apart(make_run(root, "swa", 0, {"swa": m(88.0)}, budget=1.5, name="s05",
                            extra={"method": swa, "model": {"swa": {"start": start}}}), {"model.swa.start": start})
        with_apart(make_run(root, "swa", 0, {"swa": m(88.0)}, budget=1.5, name="s05scored",
                            extra={"method": swa, "model": {"swa": {"start": start, "score_every": 1}}}),
                   {"model.swa.score_every": 1, "model.swa.start": start})
    report([root], tmp_path / "out")
    names = [line.split(" | ")[0].removeprefix("| ") for line in table_lines(tmp_path / "out")[2:]]
    assert len(names) == len(set(names)) == 4, names
    assert names[0] == "cifar10 / preresnet20"  # the defaults: SGD and the SWA run that measured nothing more
    assert "cifar10 / preresnet20 · model.swa.score_every=1" in names
    assert "cifar10 / preresnet20 · model.swa.start=0.5" in names


def test_a_method_run_only_with_its_own_settings_stands_in_the_row_with_them_named(tmp_path):
    """The row tool's SWA branch runs with model.swa.pre_schedule=base. With no other SWA beside it, it stands in the
    row of the SGD and FGE runs it was made with (one paper row), the row naming its setting, and is paired with
    that row's SGD runs (same seeds)."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    for seed, (sgd, fge, swa_acc) in enumerate([(90.0, 95.0, 91.0), (92.0, 97.0, 93.5)]):
        with_apart(make_run(root, "sgd", seed, {"sgd": m(sgd)}), {})
        with_apart(make_run(root, "fge", seed, {"fge": m(fge)}), {})
        with_apart(make_run(root, "swa", seed, {"swa": m(swa_acc)}, name="base", extra={"method": swa}),
                   {"model.swa.pre_schedule": "base"})
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", paragraph=1)
    assert lines[0] == "| row | FGE 1B (4 ep) − SGD | SWA 1B (4 ep) − SGD |"
    assert lines[2:] == ["| cifar10 / preresnet20 · SWA: model.swa.pre_schedule=base | +5.00 ± 0.00 (+5.00, +5.00) "
                         "| +1.25 ± 0.35 (+1.00, +1.50) |"]


def test_a_second_config_of_a_method_is_a_row_paired_with_the_sgd_of_the_row_it_shares_everything_else_with(tmp_path):
    """Beside the default SWA, a SWA of model.swa.pre_schedule=base is a second config of one method: it sits in a
    row of its own, its paired differences to the SGD runs of the default row (same seeds), never to another method
    of that row."""
    root = tmp_path / "g"
    swa = {"_target_": "swalab.methods.SWA"}
    for seed, (sgd, swa_acc, base_acc) in enumerate([(90.0, 95.0, 91.0), (92.0, 97.0, 93.5)]):
        with_apart(make_run(root, "sgd", seed, {"sgd": m(sgd)}), {})
        with_apart(make_run(root, "swa", seed, {"swa": m(swa_acc)}, extra={"method": swa}), {})
        with_apart(make_run(root, "swa", seed, {"swa": m(base_acc)}, name="base",
                            extra={"method": {**swa, "pre_schedule": "base"}}), {"model.swa.pre_schedule": "base"})
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", paragraph=1)
    assert lines[0] == "| row | SWA 1B (4 ep) − SGD |"
    assert lines[2:] == ["| cifar10 / preresnet20 | +5.00 ± 0.00 (+5.00, +5.00) |",
                         "| cifar10 / preresnet20 · model.swa.pre_schedule=base | +1.25 ± 0.35 (+1.00, +1.50) |"]


@pytest.mark.parametrize("group", ["model.swa", "method"])
def test_settings_that_only_add_measurements_keep_a_run_in_the_default_row(tmp_path, group):
    """SWA scored every epoch and at earlier budget marks (what the row tool asks for) trains as the default SWA:
    it shares the default row with SGD, unlabelled, whether the keys were typed under model.swa or method."""
    root = tmp_path / "g"
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    swa = {"_target_": "swalab.methods.SWA"}
    with_apart(make_run(root, "swa", 0, {"swa": m(93.0)}, name="scored", extra={"method": swa}),
               {f"{group}.score_every": 1, f"{group}.score_at_budgets": [1, 1.25]})
    report([root], tmp_path / "out")
    assert table_lines(tmp_path / "out")[2:] == ["| cifar10 / preresnet20 | 90.00 (n=1) | 93.00 (n=1) |"]


def test_a_paired_table_without_a_single_pair_says_why_rather_than_vanishing(tmp_path):
    root = tmp_path / "g"
    make_run(root, "sgd", 0, {"sgd": m(90.0)}, extra={"trainer": {"epochs": 6}})
    make_run(root, "swa", 0, {"swa": m(95.0)}, budget=1.5, extra={"trainer": {"epochs": 8}})  # B = 5.33, not 6
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Paired differences against SGD (accuracy points, per seed)", paragraph=1)
    assert lines[0] == "| row | SWA 1.5B (8 ep, B = 5.33) − SGD |"
    assert lines[2] == "| cifar10 / preresnet20 | no SGD run of B = 5.33 ep |"


def test_every_column_section_says_why_a_delta_is_missing_and_why_t_is_blank(tmp_path):
    """SWA 1.5B (8 ep) has B = 5.33, and the SGD runs B = 6: its Δ says so, as the paired table does; with no
    validation split no temperature is fitted, and one note under the tables says it."""
    import torch

    root = tmp_path / "g"
    labels = torch.tensor([0, 1, 2, 1])
    for seed in (0, 1):
        for method, budget, epochs in (("sgd", 1.0, 6), ("swa", 1.5, 8)):
            run = make_run(root, method, seed, {method: m(90.0 + seed)}, budget=budget,
                           extra={"trainer": {"epochs": epochs}})
            probs = torch.rand(4, 3).softmax(1)
            torch.save({"probs": {method: probs}, "log_probs": {method: probs.log()}, "labels": labels},
                       run / "predictions.pt")
    report([root], tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    section = text.split("## Every column of a row: accuracy, NLL, ECE, Brier\n")[1].split("\n## ")[0]
    swa = next(line for line in section.splitlines() if line.startswith("| SWA 1.5B (8 ep, B = 5.33) |"))
    assert swa.split(" | ")[-2:] == ["no SGD run of B = 5.33 ep", "no SGD run of B = 5.33 ep |"]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows and all("–" not in cell for line in rows[1:] for cell in line[-2:])  # every Δ a value or a reason
    assert section.count("no validation split") + section.count("held out a validation split") == 1


def test_section_35_sets_swa_against_the_fge_ensemble_of_its_own_budget_only(tmp_path):
    """SWA 1.5B (6 ep) has B = 4 like FGE 1B (4 ep); SWA 1.5B (24 ep) trained four times as long (B = 16): its
    distance to a 4-epoch ensemble measures the length, not the basin, so the table says why it is not there."""
    import torch

    root = tmp_path / "g"
    labels = torch.tensor([0, 1, 2, 1])
    g = torch.Generator().manual_seed(0)
    fge_run = make_run(root, "fge", 0, {"fge": m(90.0)})
    torch.save({"member_log_probs": [torch.rand(4, 3, generator=g).log_softmax(1) for _ in range(3)],
                "member_epochs": [2, 3, 4], "labels": labels}, fge_run / "fge_member_probs.pt")
    for name, epochs in (("b4", 6), ("b16", 24)):
        run = make_run(root, "swa", 0, {"swa": m(91.0, epoch=epochs)}, budget=1.5, name=name,
                       extra={"trainer": {"epochs": epochs}})
        probs = torch.rand(4, 3, generator=g).softmax(1)
        torch.save({"probs": {"swa": probs.half()}, "log_probs": {"swa": probs.log().half()}, "labels": labels},
                   run / "predictions.pt")
    report([root], tmp_path / "out")
    lines = table_lines(tmp_path / "out", "Section 3.5: SWA against the FGE ensemble", 1)
    pairs = {line.split(" | ")[1]: line.split(" | ")[2:] for line in lines[2:]}
    assert pairs["SWA 1.5B (6 ep) vs the FGE 1B (4 ep) ensemble"][0][0].isdigit()
    assert pairs["SWA 1.5B (24 ep) vs the FGE 1B (4 ep) ensemble"][0] == "not compared: B = 16 ep, the FGE's 4 ep"


def drawn(monkeypatch, plot, root, tmp_path):
    """The figure ``plot`` makes of the runs below ``root``, drawn, instead of written."""
    from swalab import style
    from swalab.results.runs import Run, run_dirs
    from swalab.results.table import build_table

    figures = []
    monkeypatch.setattr(style, "finish", lambda plt, fig, path: figures.append(fig))
    assert plot(build_table([Run(p) for p in run_dirs([root])]), tmp_path / "figure.png")
    figures[0].canvas.draw()
    return figures[0]


def test_an_fge_curve_of_three_members_has_whole_member_ticks(tmp_path, monkeypatch):
    """(An FGE of one member draws no curve at all: tests/test_figures.py.)"""
    from swalab.results.plots import plot_fge_curve

    root = tmp_path / "g"
    curve = [{"members": k, "acc": 90.0 + k} for k in (1, 2, 3)]
    for seed in (0, 1):
        make_run(root, "fge", seed, {"fge": m(93.0, members=3, curve=curve)})
        make_run(root, "swa", seed, {"swa": m(91.5)}, budget=1.5)
    ax = drawn(monkeypatch, plot_fge_curve, root, tmp_path).axes[0]
    low, high = ax.get_xlim()
    assert [t for t in ax.get_xticks() if low <= t <= high] == [1.0, 2.0, 3.0]  # not 1.5, 2.5 members


def test_the_fge_curve_draws_swa_of_the_fges_budget_only_and_the_spread_of_its_seeds(tmp_path, monkeypatch):
    """FGE 1B (4 ep) beside SWA 1.5B (6 ep), B = 4 like it, and SWA 1.5B (24 ep), B = 16: as in section 3.5 only the
    first is drawn, and the legend says why the other is not; two FGE seeds show their spread as error bars."""
    from matplotlib.container import ErrorbarContainer

    from swalab.results.plots import plot_fge_curve

    root = tmp_path / "g"
    for seed, acc in ((0, 90.0), (1, 92.0)):
        make_run(root, "fge", seed, {"fge": m(acc, curve=[{"members": 1, "acc": acc - 2}, {"members": 2, "acc": acc}])})
        for name, epochs in (("b4", 6), ("b16", 24)):
            make_run(root, "swa", seed, {"swa": m(91.0 + seed, epoch=epochs)}, budget=1.5, name=name,
                     extra={"trainer": {"epochs": epochs}})
    ax = drawn(monkeypatch, plot_fge_curve, root, tmp_path).axes[0]
    swa = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_label().split(" average")[0] for line in swa] == ["SWA 1.5B (6 ep)"]
    said = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "SWA 1.5B (24 ep)" not in said and "not drawn" in said and "B = 16 ep" in said.replace("\n", " ")
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars and bars[0].has_yerr
    low, high = bars[0].lines[2][0].get_segments()[1][:, 1]  # the bar at 2 members: lowest to highest seed
    assert (low, high) == (90.0, 92.0)


def test_reliability_panel_titles_never_run_into_each_other(tmp_path, monkeypatch):
    from swalab.results.plots import plot_reliability

    root = tmp_path / "g"
    with_apart(make_run(root, "sgd", 0, {"sgd": m(90.0)}), {})
    for name, lr in (("a", 0.005), ("b", 0.05)):
        with_apart(make_run(root, "swa", 0, {"swa": m(91.0)}, budget=1.5, name=name,
                            extra={"method": {"swa_lr": lr}}), {"model.swa.lr": lr, "model.swa.start_epoch": 5})
    figure = drawn(monkeypatch, plot_reliability, root, tmp_path)
    renderer = figure.canvas.get_renderer()
    titles = [ax.title.get_window_extent(renderer) for ax in figure.axes if ax.get_title()]
    assert len(titles) == 3
    assert not any(a.overlaps(b) for i, a in enumerate(titles) for b in titles[i + 1:])


def test_reliability_legends_cover_no_panel_and_bins_at_accuracy_0_and_1_are_drawn_whole(tmp_path, monkeypatch):
    from swalab.results.plots import plot_reliability

    root = tmp_path / "g"
    edge = [{**b, "acc": 1.0 if i == 14 else 0.0 if b["count"] else None} for i, b in enumerate(BINS)]
    for method in ("sgd", "swa"):
        run = make_run(root, method, 0, {method: m(90.0)}, budget=1.5 if method == "swa" else 1.0)
        (run / "reliability.json").write_text(json.dumps({method: edge}))
    figure = drawn(monkeypatch, plot_reliability, root, tmp_path)
    renderer = figure.canvas.get_renderer()
    panels = [ax.get_window_extent(renderer) for ax in figure.axes]
    legends = [ax.get_legend() for ax in figure.axes if ax.get_legend()]
    assert legends and not any(lg.get_window_extent(renderer).overlaps(p) for lg in legends for p in panels)
    reliability = figure.axes[0]
    low, high = reliability.get_ylim()
    bins = [line for line in reliability.get_lines() if not line.get_label().startswith("perfect")]
    assert {0.0, 1.0} <= {y for line in bins for y in line.get_ydata()}
    assert (low < 0 and high > 1) or not any(line.get_clip_on() for line in bins)  # markers at 0 and 1 not cut


def test_test_error_axis_reads_in_plain_percent(grid, tmp_path, monkeypatch):
    from swalab.results.plots import plot_test_error

    ax = drawn(monkeypatch, plot_test_error, grid, tmp_path).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and not any("^" in t or "times" in t for t in labels), labels  # 20, 30, not 2×10^1


def test_test_error_lines_stay_told_apart_their_bands_faint_and_panels_three_to_a_row(grid, tmp_path, monkeypatch):
    """Lines that lie on each other (an FGE run's iterate over the SGD run of its seed) differ in marker and dash
    pattern, each drawn under later ones a little wider; each seed band is faint and in its own line's colour; three
    rows of panels are three to a row, a page's width (tests/test_figures.py: 1, 3 and 8 of them)."""
    from matplotlib.colors import to_rgb

    from swalab.results.plots import plot_test_error

    for name, lr in (("a", 0.005), ("b", 0.05)):
        with_apart(make_run(grid, "swa", 0, {"swa": m(91.0)}, budget=1.5, name=name, extra={"method": {"swa_lr": lr}}),
                   {"model.swa.lr": lr})
    figure = drawn(monkeypatch, plot_test_error, grid, tmp_path)
    axes = [ax for ax in figure.axes if ax.get_lines()]
    assert len(axes) == 3 and len({round(ax.get_position().x0, 2) for ax in axes}) == 3
    assert figure.get_figwidth() <= 15.5
    lines = [line for line in axes[0].get_lines() if not line.get_label().startswith("_")]
    colours = {line.get_label(): to_rgb(line.get_color()) for line in lines}
    looks = {(to_rgb(line.get_color()), line.get_marker(), line.get_linestyle()) for line in lines}
    assert len(lines) >= 4 and len(looks) == len(lines)
    groups = {}
    for line in lines:
        groups.setdefault(line.get_color(), line)
    assert len({line.get_marker() for line in groups.values()}) == len(groups)  # no two methods share a marker
    widths = [line.get_linewidth() for line in groups.values()]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]  # the first drawn shows beneath
    bands = axes[0].collections
    assert bands and all(band.get_facecolor()[0][3] <= 0.1 for band in bands)
    assert all(tuple(band.get_facecolor()[0][:3]) in colours.values() for band in bands)


def test_a_branched_runs_parent_outside_the_working_directory_is_named_below_what_they_share(tmp_path, monkeypatch):
    from swalab.results.write import shown_parent

    out = tmp_path / "out" / "imagenet" / "lite0"
    child, parent = out / "swa" / "x" / "seed0", out / "ema" / "y" / "seed0"
    parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert shown_parent(child, str(parent)) == "ema/y/seed0"  # no path of this machine in a committed report
    monkeypatch.chdir(tmp_path)
    assert shown_parent(child, str(parent)) == "out/imagenet/lite0/ema/y/seed0"  # below the working directory
    assert shown_parent(child, "runs/ema/seed0") == "runs/ema/seed0"  # as recorded when recorded relative


def test_runs_scored_only_at_their_end_draw_no_test_error_figure(tmp_path):
    """With run.eval_every=0 each run has one scored epoch: a point per run is not a curve, so no figure is drawn
    (it was two dots on an axis of unlabelled ticks); with two scored epochs there is one."""
    from swalab.results.plots import plot_test_error
    from swalab.results.runs import Run, run_dirs
    from swalab.results.table import build_table

    end_only = [{"epoch": 1}, {"epoch": 2, "test_acc": 52.0}]
    for method, seed in (("sgd", 0), ("swa", 0)):
        make_run(tmp_path / "end", method, seed, {method: {"acc": 52.0, "nll": 1.0, "ece": 0.1}}, history=end_only)
    table = build_table([Run(p) for p in run_dirs([tmp_path / "end"])])
    assert not plot_test_error(table, tmp_path / "end.png") and not (tmp_path / "end.png").exists()
    make_run(tmp_path / "curve", "sgd", 0, {"sgd": {"acc": 52.0, "nll": 1.0, "ece": 0.1}})
    assert plot_test_error(build_table([Run(p) for p in run_dirs([tmp_path / "curve"])]), tmp_path / "curve.png")


def test_a_column_without_an_sgd_twin_leaves_the_pairs_of_the_columns_after_it():
    """paired_differences goes on past a column that has no SGD run of its B (SWA 1.5B (8 ep): B = 5.33)."""
    from types import SimpleNamespace

    from swalab.results.table import Cell, Column, Entry, Row, paired_differences

    def cell(column, *accs):
        return Cell([Entry(SimpleNamespace(seed=seed), column.method, column, {"acc": acc})
                     for seed, acc in enumerate(accs)])

    sgd, swa8, fge = Column("sgd", 1.0, 6), Column("swa", 1.5, 8), Column("fge", 1.0, 6)
    row = Row("cifar10", "preresnet20", "", {sgd: cell(sgd, 90.0, 92.0), swa8: cell(swa8, 95.0, 96.0),
                                             fge: cell(fge, 91.0, 94.0)})
    assert paired_differences(row) == {fge: [1.0, 2.0]}


def test_a_row_of_swa_branched_off_the_sgd_trunk_draws_its_paired_sgd_named_by_its_settings(tmp_path, monkeypatch):
    """The row tool's SWA (model.swa.pre_schedule=base) beside a SWA of the defaults has a row of its own without an
    SGD run: its test-error panel still shows the SGD run its differences are taken against, labelled with whose
    settings it has."""
    from swalab.results.plots import plot_test_error

    root = tmp_path / "g"
    for seed in (0, 1):
        make_run(root, "sgd", seed, {"sgd": m(90.0)})
        make_run(root, "swa", seed, {"swa": m(91.5)}, budget=1.5)
        with_apart(make_run(root, "swa", seed, {"swa": m(91.0)}, budget=1.5, name="base",
                            extra={"model": {"swa": {"pre_schedule": "base"}}}), {"model.swa.pre_schedule": "base"})
    figure = drawn(monkeypatch, plot_test_error, root, tmp_path)
    swa_panel = next(ax for ax in figure.axes if ax.get_title() == "model.swa.pre_schedule=base")
    labels = [line.get_label() for line in swa_panel.get_lines() if not line.get_label().startswith("_")]
    assert "SGD 1B (4 ep) · the defaults (n=2)" in labels, labels


def test_the_first_epochs_error_runs_above_the_top_where_it_would_squeeze_the_last_ones():
    from swalab.results.plots import error_range

    falling = {e: [80.0 / e + 9.0] for e in range(1, 201)}  # 89% after epoch 1, 9.4% at the end
    shown, top = error_range([falling])
    assert top is not None and top < 20.0 and max(shown) < top and min(shown) == min(falling[200])
    flat = {e: [30.0 - e / 20] for e in range(1, 201)}  # never more than twice its later error: drawn whole
    assert error_range([flat]) == ([v for vs in flat.values() for v in vs], None)


def test_the_same_report_made_twice_writes_the_same_bytes_pdfs_included(grid, tmp_path, monkeypatch):
    """A report made again from the same runs is the same files, byte for byte: a committed report/ folder made anew
    shows no change. The PDFs carried the moment they were written (their CreationDate), so each one differed."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")  # matplotlib dates a PDF by this when set: two different moments
    report([grid], tmp_path / "first")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")
    report([grid], tmp_path / "second")
    written = sorted(p.name for p in (tmp_path / "first").iterdir())
    assert any(name.endswith(".pdf") for name in written), written
    assert [n for n in written if (tmp_path / "first" / n).read_bytes() != (tmp_path / "second" / n).read_bytes()] == []
