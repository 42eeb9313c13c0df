"""``python -m swalab.results.report <grid> --wandb``: a real W&B Report of a real (tiny) grid, built without network:
Table 1 as numbers, test error against epoch per config, the FGE curve with SWA, every panel's runs found by
the grid's tag; offline, a spec and the one command that publishes it."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
import wandb_workspaces.reports.v2 as wr  # a dependency of swalab: a missing one fails here, never skips

from conftest import REPO
from swalab.results import wandb_report
from swalab.results.report import report
from swalab.results.write import load_paper_tables
from swalab.tracking import RECORD_FILE
from test_report import m, make_run

# B = 14 epochs: SGD and FGE train 14, SWA 1.5B 21, so SWA stands on FGE's B (section 3.5 compares only at one B), and
# FGE's default pretraining (0.8 B = 11 epochs) leaves two cycles' middles: two members. Every method on its defaults
# keeps the three in one table row (a method of other settings is a row of its own).
GRID = ["dataset.train_size=128", "trainer.batch_size=64", "model.budget_epochs=14", "model.arch.depth=8",
        "run.eval_every=1", "run.progress=false", "logger=wandb",
        "model.swa.score_every=1",  # SWA scores its average each epoch: the training panel plots it beside the live model
        "method=sgd,swa,fge", "seed=0,1"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """SGD, SWA and FGE with two seeds each, trained by ``run.py -m`` with W&B offline: the grid's record dir."""
    out = tmp_path_factory.mktemp("grid")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "OMP_NUM_THREADS": "1",
           "WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, str(REPO / "run.py"), "-m", *GRID, f"paths.output_dir={out}"], cwd=out,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = (out / "grids").iterdir()
    return record


@pytest.fixture(scope="module")
def built(grid, tmp_path_factory):
    """The report of ``grid``, offline, with no W&B key in sight."""
    out = tmp_path_factory.mktemp("report")
    saved = {k: os.environ.pop(k) for k in ("WANDB_API_KEY", "WANDB_MODE") if k in os.environ}
    try:
        result = report([grid], out, wandb_mode="offline")
    finally:
        os.environ.update(saved)
    return result


def grids_of(report_object):
    return [b for b in report_object.blocks if isinstance(b, wr.PanelGrid)]


def headings(report_object):
    return [b.text for b in report_object.blocks if isinstance(b, wr.H2)]


def records_of(grid):
    """The W&B records of the grid's runs (the output directory holds the grid's record and its runs)."""
    return [json.loads(p.read_text()) for p in grid.parent.parent.rglob(RECORD_FILE)]


def table_file(out, key):
    [path] = (out / "wandb").glob(f"offline-run-*/files/media/table/{key}_*.table.json")
    return json.loads(path.read_text())


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_the_report_has_table_1_each_configs_training_runs_fge_against_swa_and_the_text(built):
    # a row is named by the settings its configs share (the grid's overrides, in the keys typed)
    assert headings(built["wandb"]["report"]) == [
        "Table 1: test accuracy, NLL, ECE and Brier score",
        "digits / preresnet20 · dataset.train_size=128, model.arch.depth=8, trainer.batch_size=64: training runs",
        "FGE against SWA", "The tables as text (table.md)"]


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_table_1_is_numeric_mean_std_and_n_read_from_the_report_run(built):
    published = built["wandb"]
    table1 = grids_of(published["report"])[0]
    [runset] = table1.runsets
    report_run = runset.filters.split("'")[1]
    assert runset.filters == f"Metric(\"ID\") == '{report_run}'"
    assert [p.table_name for p in table1.panels] == ["table1/acc", "table1/nll", "table1/ece", "table1/brier"]
    logged = table_file(published["spec"].parent, "table1/acc")
    assert logged["columns"][:5] == ["row", "source", "SGD 1B (14 ep) mean", "SGD 1B (14 ep) std", "SGD 1B (14 ep) n"]
    [row] = logged["data"]
    swa = [json.loads((e.run.path / "metrics.json").read_text())["swa"]["acc"]
           for e in built["table"].rows[0].cells[next(c for c in built["table"].columns if c.method == "swa")].entries]
    at = logged["columns"].index("SWA 1.5B (21 ep) mean")
    assert row[at:at + 3] == [pytest.approx(statistics.fmean(swa)), pytest.approx(statistics.stdev(swa)), 2]


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_each_training_panel_shows_the_grids_runs_by_tag_and_group_with_error_against_epoch(built, grid):
    training = grids_of(built["wandb"]["report"])[1]
    [runset] = training.runsets
    groups = sorted({r["group"] for r in records_of(grid)})
    assert len(groups) == 3 and all(f"grid:{grid.name}" in r["tags"] for r in records_of(grid))
    assert runset.filters == f"Metric(\"Tags\") in ['grid:{grid.name}'] and Metric(\"Group\") in {groups}"
    error, reliability, fge = training.panels
    assert (error.x, error.y, error.groupby, error.groupby_aggfunc, error.groupby_rangefunc) == (
        "epoch", ["test_error", "swa_test_error"], "Group", "mean", "stddev")
    assert reliability.query == {"summaryTable": {"tableKey": "reliability_table"}}
    assert fge.query == {"summaryTable": {"tableKey": "fge/curve_table"}} and fge.chart_fields == {"x": "members",
                                                                                                  "y": "acc"}


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_the_fge_members_curve_is_drawn_with_each_swa_column_as_a_flat_line(built):
    panel_grid = grids_of(built["wandb"]["report"])[2]
    [chart] = panel_grid.panels
    assert chart.query == {"summaryTable": {"tableKey": "fge_vs_swa/0_table"}} and panel_grid.runsets[0].filters == \
        grids_of(built["wandb"]["report"])[0].runsets[0].filters  # the report run
    logged = table_file(built["wandb"]["spec"].parent, "fge_vs_swa/0_table")
    series = {}
    for members, acc, name in logged["data"]:
        series.setdefault(name, []).append((members, acc))
    assert sorted(series) == ["FGE 1B (14 ep) ensemble", "SWA 1.5B (21 ep) model"]
    assert [k for k, _ in series["FGE 1B (14 ep) ensemble"]] == [1, 2]
    assert len({acc for _, acc in series["SWA 1.5B (21 ep) model"]}) == 1


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_offline_the_spec_is_written_next_to_table_md_and_reads_back_as_the_same_report(built, grid):
    spec_path = built["wandb"]["spec"]
    assert spec_path.parent == built["written"]["table.md"].parent
    assert built["wandb"]["command"] == f"python -m swalab.results.wandb_report publish {spec_path}"
    data = json.loads(spec_path.read_text())
    again = wandb_report.report_from_spec(data["report"])
    assert headings(again) == headings(built["wandb"]["report"])
    assert [rs.filters for g in grids_of(again) for rs in g.runsets] == \
        [rs.filters for g in grids_of(built["wandb"]["report"]) for rs in g.runsets]
    assert len(data["offline_runs"]) == 6 + 1  # every training run and the report run
    outline = wandb_report.outline(data["report"])
    assert "  panel table table1/acc" in outline and f"tags IN ['grid:{grid.name}']" in "\n".join(outline)


@pytest.mark.slow  # trains a 3x2 grid once for the module (about 20 s on 2 cores)
def test_publishing_later_uploads_the_offline_runs_then_saves_the_report(built, monkeypatch):
    calls, saved = [], []
    monkeypatch.setattr(wandb_report, "wandb_api", lambda spec: SimpleNamespace(default_entity="mine"))  # a key
    monkeypatch.setattr(wandb_report.subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.setattr(wr.Report, "save", lambda self, **kw: saved.append(self) or self)
    monkeypatch.setattr(wr.Report, "url", property(lambda self: f"https://wandb.ai/{self.entity}/{self.project}/r"))
    assert wandb_report.main(["publish", str(built["wandb"]["spec"]), "--entity", "me"]) == 0
    [sync] = calls
    assert sync[1:4] == ["-m", "wandb", "sync"] and len(sync[4:]) == 7
    [report_object] = saved
    assert report_object.entity == "me" and headings(report_object) == headings(built["wandb"]["report"])


def test_the_papers_numbers_stand_beside_ours_as_numbers(tmp_path):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)}, dataset="cifar100", model="vgg16")
    make_run(tmp_path / "g", "sgd", 1, {"sgd": m(72.0)}, dataset="cifar100", model="vgg16")
    table = report([tmp_path / "g"], tmp_path / "out")["table"]
    header, lines = wandb_report.numeric_tables(table, load_paper_tables())["table1/acc"]
    assert header == ["row", "source", "SGD 1B (4 ep) mean", "SGD 1B (4 ep) std", "SGD 1B (4 ep) n"]
    assert lines[0][1:4] == ["swalab", pytest.approx(71.0), pytest.approx(2 ** 0.5)]
    assert lines[1] == ["cifar100 / vgg16 (paper)", "paper", 72.55, 0.10, None]


def test_runs_trained_without_wandb_get_no_training_panels_and_say_so(tmp_path):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(70.0)})
    table = report([tmp_path / "g"], tmp_path / "out")["table"]
    made = wandb_report.build_report(table, project="p", entity=None, report_run="abc")
    assert len(grids_of(made)) == 1  # Table 1 only
    assert any(isinstance(b, wr.P) and "not logged to W&B" in str(b.text) for b in made.blocks)


def test_a_report_of_recorded_runs_links_each_config_by_grid_tag_and_group_without_network(tmp_path):
    """The same structure from run directories that only say who they are on W&B (no training, no W&B)."""
    for seed, (sgd, swa, swa1, fge) in enumerate([(90.0, 92.0, 91.0, 91.5), (92.0, 94.0, 93.0, 92.5)]):
        make_run(tmp_path / "g", "sgd", seed, {"sgd": m(sgd)})
        make_run(tmp_path / "g", "swa", seed, {"swa": m(swa), "swa@1": m(swa1, budget=1.0, epoch=4)}, budget=1.5)
        make_run(tmp_path / "g", "fge", seed, {"fge": m(fge, curve=[{"members": 1, "acc": 80.0},
                                                                      {"members": 2, "acc": fge}])})
    table = report([tmp_path / "g"], tmp_path / "out")["table"]
    for n, run in enumerate(run for row in table.rows for cell in row.cells.values() for run in
                            (e.run for e in cell.entries)):
        tags = ["swa-lab", f"method:{run.method}", "grid:2026-01-02_03-04-05"] + (["grid:2026-01-03_00-00-00"] * (n == 0))
        (run.path / RECORD_FILE).write_text(json.dumps({"id": f"run{n}", "group": f"g-{run.method}", "tags": tags}))
    made = wandb_report.build_report(table, project="p", entity=None, report_run="rep1")
    assert headings(made) == ["Table 1: test accuracy, NLL, ECE and Brier score", "cifar10 / preresnet20: training runs",
                              "FGE against SWA", "The tables as text (table.md)"]
    table1, training, fge = grids_of(made)
    assert table1.runsets[0].filters == "Metric(\"ID\") == 'rep1'" == fge.runsets[0].filters
    assert training.runsets[0].filters == ("Metric(\"Tags\") in ['grid:2026-01-02_03-04-05', 'grid:2026-01-03_00-00-00'] "
                                           "and Metric(\"Group\") in ['g-fge', 'g-sgd', 'g-swa']")
    assert [type(p).__name__ for p in training.panels] == ["LinePlot", "CustomChart", "CustomChart"]
    _, lines = wandb_report.fge_against_swa(table)["fge_vs_swa/0"]
    assert lines == [[1, 80.0, "FGE 1B (4 ep) ensemble"], [2, 92.0, "FGE 1B (4 ep) ensemble"],
                     [1, 92.0, "SWA 1B (4 ep) model"], [2, 92.0, "SWA 1B (4 ep) model"],
                     [1, 93.0, "SWA 1.5B (6 ep) model"], [2, 93.0, "SWA 1.5B (6 ep) model"]]
    spec = wandb_report.spec_of(made)  # serialised without a W&B server or key
    assert spec["project"] == {"name": "p", "entityName": ""} and "  panel table table1/ece" in wandb_report.outline(spec)


def test_the_report_counts_each_run_once_and_its_rows_in_words(tmp_path):
    """One SWA run makes two columns (1B and 1.5B): 6 runs of 2 seeds make 8 cells' entries, and 6 runs are said."""
    for seed in (0, 1):
        make_run(tmp_path / "g", "sgd", seed, {"sgd": m(90.0)})
        make_run(tmp_path / "g", "swa", seed, {"swa": m(92.0), "swa@1": m(91.0, budget=1.0, epoch=4)}, budget=1.5)
        make_run(tmp_path / "g", "fge", seed, {"fge": m(91.5)})
    table = report([tmp_path / "g"], tmp_path / "out")["table"]
    made = wandb_report.build_report(table, project="p", entity=None, report_run="rep1")
    first = str(made.blocks[0].text)
    assert first.startswith("6 finished runs in 1 table row, seeds 0, 1."), first


def test_the_reports_description_records_the_command_that_made_it_with_its_input_and_out(tmp_path, monkeypatch):
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(90.0)})
    monkeypatch.setenv("WANDB_MODE", "offline")
    made = report([tmp_path / "g"], tmp_path / "out", wandb_mode="offline")["wandb"]["report"]
    assert made.description == f"python -m swalab.results.report {tmp_path / 'g'} --out {tmp_path / 'out'} --wandb"


@pytest.fixture
def no_wandb_key(tmp_path, monkeypatch):
    """A machine where W&B has no API key: none in the environment, no ``~/.netrc``, no W&B settings file."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))


def offline_spec(tmp_path, monkeypatch):
    """The spec an offline ``report --wandb`` writes, for one recorded run."""
    make_run(tmp_path / "g", "sgd", 0, {"sgd": m(90.0)})
    monkeypatch.setenv("WANDB_MODE", "offline")
    spec = report([tmp_path / "g"], tmp_path / "out", wandb_mode="offline")["wandb"]["spec"]
    monkeypatch.delenv("WANDB_MODE")
    return spec


@pytest.mark.parametrize("sync", [True, False], ids=["with-sync", "no-sync"])
def test_publishing_without_an_api_key_says_in_one_line_how_to_log_in_and_uploads_nothing(
        tmp_path, monkeypatch, capsys, no_wandb_key, sync):
    spec = offline_spec(tmp_path, monkeypatch)

    def wandb_sync_without_a_key(cmd, check):  # what `wandb sync` does without a key: prints W&B's error, exits 1
        raise subprocess.CalledProcessError(1, cmd)
    monkeypatch.setattr(wandb_report.subprocess, "run", wandb_sync_without_a_key)
    monkeypatch.setattr(wr.Report, "save", lambda self, **kw: pytest.fail("saved without a key"))
    capsys.readouterr()
    assert wandb_report.main(["publish", str(spec)] + ([] if sync else ["--no-sync"])) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "`wandb login`" in err and "WANDB_API_KEY" in err
    assert f"python -m swalab.results.wandb_report publish {spec}" in err  # the command to rerun, the spec kept
    assert "Command '[" not in err and "CalledProcessError" not in err


def test_a_failing_wandb_sync_is_said_in_one_line_with_the_command_to_rerun_and_nothing_is_saved(
        tmp_path, monkeypatch, capsys):
    spec = offline_spec(tmp_path, monkeypatch)
    monkeypatch.setattr(wandb_report, "wandb_api", lambda spec: SimpleNamespace(default_entity="mine"))  # a key

    def wandb_sync_fails(cmd, check):  # no network: W&B prints its error, exits 1
        raise subprocess.CalledProcessError(1, cmd)
    monkeypatch.setattr(wandb_report.subprocess, "run", wandb_sync_fails)
    monkeypatch.setattr(wr.Report, "save", lambda self, **kw: pytest.fail("saved though the runs were not uploaded"))
    capsys.readouterr()
    assert wandb_report.main(["publish", str(spec)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "`wandb sync` of 1 offline run failed (exit status 1" in err
    assert f"python -m swalab.results.wandb_report publish {spec}" in err and "Command '[" not in err
