"""Branching a Table 1 row off one SGD trunk gives exactly the runs trained straight through.

Tiny real runs on scikit-learn's digits (128 training images, batches of 64, a PreResNet-8, a
budget of 4 epochs, SWA from epoch 3), trained in-process on the CPU. The equality tests train
several runs each and are marked slow (``pytest -m slow tests/test_branching.py``); the default
selection trains only the shared SGD trunk.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import swalab  # noqa: F401  (registers resolvers)
from swalab.branching import BranchError, check_branch, load_branch_state, read_lineage
from swalab.train.build import data_files_record
from swalab.identity import identity_of
from swalab.methods import FGE, SGD, SWA
from swalab.results.report import report
from swalab.results.row import RowError, plan_row, row_cost, row_records
from swalab.schedules import PaperSGD
from swalab.train import train

CONF = Path(__file__).resolve().parents[1] / "conf"
B = 4  # the budget in epochs
TINY = ["logger=none", "run.progress=false", "dataset=digits", "model=preresnet20", "model.arch.depth=8",
        "dataset.train_size=128", "trainer.batch_size=64", "run.eval_every=0", "run.eval_batch_size=512",
        f"model.budget_epochs={B}", "model.swa.start_epoch=3", "seed=0"]
# SWA that branches off the SGD run "without modifying the learning rate schedule": the SGD run's schedule
SWA_BASE = ["method=swa", "model.swa.pre_schedule=base", f"schedule.horizon={B}"]


def cfg_of(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


def run(run_dir: Path, *overrides: str) -> dict:
    train(cfg_of(*overrides), run_dir=run_dir)
    return json.loads((run_dir / "metrics.json").read_text())


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path, which: str | None = None) -> dict[str, torch.Tensor]:
    final = torch.load(run_dir / "final.pt", map_location="cpu", weights_only=False)
    return final["model"] if which is None else final["methods"][which]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def without_timing(metrics: dict) -> dict:
    return {name: {k: v for k, v in m.items() if k != "seconds"} for name, m in metrics.items()}


@pytest.fixture(scope="module")
def trunk(tmp_path_factory) -> Path:
    """The SGD run of one budget, keeping its checkpoints after epochs 2 and 3 for branching."""
    run_dir = tmp_path_factory.mktemp("trunk") / "sgd"
    run(run_dir, "method=sgd", "run.save_at=[2,3]")
    return run_dir


@pytest.mark.slow  # trains several tiny runs: ~10 s on an idle 2-core machine, a minute under load
def test_swa_scored_at_a_budget_mark_equals_a_run_stopped_there(tmp_path):
    long = tmp_path / "swa_1.5"
    short = tmp_path / "swa_1"
    long_metrics = run(long, *SWA_BASE, "method.budget=1.5", "model.swa.score_at_budgets=[1.0]", f"run.save_at=[{B}]")
    short_metrics = run(short, *SWA_BASE, "method.budget=1")
    assert [r["lr"] for r in history(long)][:B] == [r["lr"] for r in history(short)]
    assert long_metrics["swa@1"] == {k: v for k, v in short_metrics["swa"].items() if k != "n_averaged"}
    at_mark = torch.load(long / "checkpoints" / "saved" / f"epoch{B:04d}.pt", weights_only=False)["method"]["averaged"]
    assert int(at_mark["n_averaged"]) == short_metrics["swa"]["n_averaged"] == 2  # epochs 3 and 4
    averaged = {k.removeprefix("module."): v for k, v in at_mark.items() if k.startswith("module.")}
    assert_same_weights(averaged, final_weights(short, "swa"))
    assert long_metrics["swa"]["n_averaged"] == 4  # the 1.5-budget average goes on to epoch 6


@pytest.mark.slow  # trains several tiny runs: ~10 s on an idle 2-core machine, a minute under load
def test_a_swa_branch_equals_the_run_trained_straight_through(trunk, tmp_path):
    branch = tmp_path / "branch"
    straight = tmp_path / "straight"
    swa = [*SWA_BASE, "method.budget=1.5", "model.swa.score_at_budgets=[1.0,1.25]"]
    branch_metrics = run(branch, *swa, f"run.branch_from={trunk}@2")
    straight_metrics = run(straight, *swa)
    assert set(branch_metrics) == {"swa@1", "swa@1.25", "swa", "sgd"}
    assert without_timing(branch_metrics) == without_timing(straight_metrics)
    assert_same_weights(final_weights(branch, "swa"), final_weights(straight, "swa"))
    assert_same_weights(final_weights(branch), final_weights(straight))
    keep = ("epoch", "lr", "train_loss", "train_acc")
    assert [{k: r[k] for k in keep} for r in history(branch)] == [{k: r[k] for k in keep} for r in history(straight)]
    assert [r["train_loss"] for r in history(branch)][:2] == [r["train_loss"] for r in history(trunk)][:2]


@pytest.mark.slow  # trains several tiny runs: ~10 s on an idle 2-core machine, a minute under load
def test_a_swag_branch_equals_the_run_trained_straight_through_and_scores_swa_beside_swag(trunk, tmp_path):
    """``row --swag`` trains the SWA branch as SWAG: off the SGD trunk it must end as a SWAG run trained straight
    through (its samples drawn alike), and its SWA predictors as those of the SWA branch."""
    swag = [*SWA_BASE, "method=swag", "method.samples=2", "method.budget=1.5", "model.swa.score_at_budgets=[1.0]"]
    branch_metrics = run(tmp_path / "branch", *swag, f"run.branch_from={trunk}@2")
    straight_metrics = run(tmp_path / "straight", *swag)
    assert set(branch_metrics) == {"swa@1", "swa", "sgd", "swag", "swag_diag"}
    assert without_timing(branch_metrics) == without_timing(straight_metrics)
    swa_branch = run(tmp_path / "swa", *SWA_BASE, "method.budget=1.5", "model.swa.score_at_budgets=[1.0]",
                     f"run.branch_from={trunk}@2")
    assert branch_metrics["swa"] == swa_branch["swa"] and branch_metrics["swa@1"] == swa_branch["swa@1"]


def test_a_row_with_swag_trains_its_swa_branch_as_swag_and_records_both_columns():
    extra = ["logger=none", "model.budget_epochs=8", "model.swa.start_epoch=6", "paths.output_dir=/tmp/swalab-row-plan"]
    plain, swag = (plan_row("digits", "preresnet20", 0, extra, swag=s) for s in (False, True))
    assert [j.name for j in swag] == ["sgd", "swag", "fge"]
    assert swag[1].branch_epoch == plain[1].branch_epoch == 5 and swag[1].parent == "sgd"
    assert [o for o in swag[1].overrides if o != "method=swag"] == [o for o in plain[1].overrides if o != "method=swa"]
    assert swag[1].columns == {"SWA 1B": "swa@1", "SWA 1.25B": "swa@1.25", "SWA 1.5B": "swa", "SWAG 1.5B": "swag",
                               "SWAG-diag 1.5B": "swag_diag"}
    naive = plan_row("digits", "preresnet20", 0, extra, naive=True, swag=True)
    assert [j.name for j in naive] == ["sgd", "fge", "swa_b1", "swa_b1.25", "swag_b1.5"]
    assert "method=swag" in naive[-1].overrides and "SWAG-diag 1.5B" in naive[-1].columns


@pytest.mark.slow  # trains several tiny runs: ~10 s on an idle 2-core machine, a minute under load
def test_a_fge_branch_equals_the_run_trained_straight_through(trunk, tmp_path):
    fge = ["method=fge", "model.fge.pretrain_epochs=2", "model.fge.cycle_epochs=2"]
    branch_metrics = run(tmp_path / "branch", *fge, f"run.branch_from={trunk}@2")
    straight_metrics = run(tmp_path / "straight", *fge)
    assert branch_metrics["fge"]["member_epochs"] == [3] and branch_metrics["fge"]["members"] == 1
    assert without_timing(branch_metrics) == without_timing(straight_metrics)


@pytest.mark.slow  # trains several tiny runs: ~10 s on an idle 2-core machine, a minute under load
def test_the_lineage_is_written_and_read_back(trunk, tmp_path):
    child = tmp_path / "swa"
    run(child, *SWA_BASE, "method.budget=1.25", f"run.branch_from={trunk}@2")
    lineage = read_lineage(child)
    assert lineage == {"kind": "branch", "parent": str(trunk), "epoch": 2,
                       "checkpoint": str(trunk / "checkpoints" / "saved" / "epoch0002.pt"),
                       "parent_method": "sgd", "parent_epochs": B}
    assert read_lineage(trunk) is None


def identity(*overrides: str) -> dict:
    """The identity a run of these overrides has (``swalab.train.prepare``), data fingerprint included."""
    cfg = cfg_of(*overrides)
    return identity_of(OmegaConf.to_container(cfg, resolve=True), data_files_record(cfg)["fingerprint"])


def test_a_branch_from_another_seed_or_model_is_refused(trunk):
    with pytest.raises(BranchError, match="seed: 0 there, 1 here"):
        load_branch_state(f"{trunk}@2", identity(*SWA_BASE, "seed=1"))
    with pytest.raises(BranchError, match="trainer.batch_size: 64 there, 32 here"):
        load_branch_state(f"{trunk}@2", identity(*SWA_BASE, "trainer.batch_size=32"))
    with pytest.raises(BranchError, match="optimizer.weight_decay: 0.0005 there, 0.0001 here"):  # the optimizer's too
        load_branch_state(f"{trunk}@2", identity(*SWA_BASE, "model.weight_decay=1e-4"))
    with pytest.raises(BranchError, match="optimizer._target_: 'torch.optim.SGD' there, 'torch.optim.AdamW' here"):
        load_branch_state(f"{trunk}@2", identity(*SWA_BASE, "optimizer=adamw"))
    state, lineage = load_branch_state(f"{trunk}@2", identity(*SWA_BASE, "method.budget=1.5"))  # method, epochs differ
    assert state["method"] is None and state["epoch"] == 2 and len(state["history"]) == 2
    assert (lineage["parent_method"], lineage["parent_epochs"]) == ("sgd", B)
    with pytest.raises(FileNotFoundError, match=r"run.save_at=\[1\]") as why:
        load_branch_state(f"{trunk}@1", identity(*SWA_BASE))
    assert "move it away" in str(why.value)  # its own command (a row's too) skips a finished trunk: no checkpoint comes
    with pytest.raises(BranchError, match="<run dir>@<epoch>"):
        load_branch_state(str(trunk), identity(*SWA_BASE))


def synthetic_state(lrs: list[float]) -> dict:
    return {"epoch": len(lrs), "history": [{"epoch": e + 1, "lr": lr} for e, lr in enumerate(lrs)]}


def test_a_branch_that_would_miss_a_capture_or_use_another_lr_is_refused():
    sgd_schedule = PaperSGD(lr=0.1, horizon=8)  # constant to epoch 4, then decaying
    trunk_lrs = [sgd_schedule.at(e, 0, 10) for e in range(7)]
    swa = SWA(sgd_schedule, 12, start_epoch=7, lr=0.01, pre_schedule="base")
    check_branch(swa, synthetic_state(trunk_lrs[:6]), 10)  # swa_start - 1: fine
    with pytest.raises(BranchError, match="branch at epoch 6 or earlier"):
        check_branch(swa, synthetic_state(trunk_lrs), 10)
    reference = SWA(sgd_schedule, 12, start_epoch=7, lr=0.01, pre_schedule="reference")  # paper shape
    with pytest.raises(BranchError, match="schedules differ before the branch point"):
        check_branch(reference, synthetic_state(trunk_lrs[:6]), 10)
    longer_horizon = SWA(PaperSGD(lr=0.1, horizon=12), 12, start_epoch=7, lr=0.01, pre_schedule="base")
    with pytest.raises(BranchError, match="schedule.horizon"):
        check_branch(longer_horizon, synthetic_state(trunk_lrs[:6]), 10)
    fge = FGE(sgd_schedule, 8, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=5, pre_schedule="base")
    assert fge.last_branch_epoch() == 5 and SGD(sgd_schedule, 8).last_branch_epoch() == 8
    check_branch(fge, synthetic_state(trunk_lrs[:5]), 10)


@pytest.mark.parametrize("override, reason", [
    ("method=swa", "a row trains every method itself"), ("seed=1", "--seeds"), ("model=vgg16", "--model"),
    ("run.dir=somewhere", "paths.output_dir"), ("trainer.epochs=6", "model.budget_epochs=<B>")])
def test_a_row_refuses_overrides_that_would_contradict_it(override, reason):
    with pytest.raises(RowError, match=re.escape(reason)):
        plan_row("digits", "preresnet20", 0, ["logger=none", override])


def test_a_job_of_a_row_that_is_refused_says_to_deal_with_why_before_running_the_row_again(tmp_path):
    """A job refused (exit 2: a trunk that finished without its branch points' checkpoints, a bad value) is refused
    again by the same command until the cause is dealt with: the row's last line must not send one round in a loop."""
    from swalab.results.row import Job, run_jobs

    with pytest.raises(RowError, match=r"job swa ended with exit 2 \(see above\)") as ended:
        run_jobs([Job("swa", ["seed=abc"], tmp_path / "run")])
    assert "once what it says is dealt with, run the same command again" in str(ended.value)


def test_a_row_plans_one_trunk_and_two_branches():
    jobs = plan_row("digits", "preresnet20", 0, ["logger=none", "model.budget_epochs=8", "model.swa.start_epoch=6",
                                                 "paths.output_dir=/tmp/swalab-row-plan"])
    assert [j.name for j in jobs] == ["sgd", "swa", "fge"]
    sgd, swa, fge = jobs
    assert "run.save_at=[5,6]" in sgd.overrides  # SWA branches at swa_start - 1, FGE at pretrain_epochs = 6
    assert (swa.branch_epoch, fge.branch_epoch) == (5, 6)
    assert f"run.branch_from={sgd.run_dir}@5" in swa.overrides  # a run directory needs no quoting
    assert {"method.budget=1.5", "model.swa.pre_schedule=base", "model.swa.score_at_budgets=[1,1.25]",
            "schedule.horizon=8"} <= set(swa.overrides)
    assert swa.columns == {"SWA 1B": "swa@1", "SWA 1.25B": "swa@1.25", "SWA 1.5B": "swa"}
    assert sgd.run_dir.parts[-3:] == ("sgd", "trainer.epochs-8", "seed0")  # B = 8: its length; save_at is not a setting


def test_a_rows_record_moves_with_its_output_directory_and_its_wall_time_comes_from_the_runs(tmp_path):
    """``python -m swalab.results.row`` as a user runs it; the output directory is then moved (as into docs/) and
    reported there: the same columns, and the wall time counts each run's own epochs once, however launched."""
    tiny = [o for o in TINY if not o.startswith(("dataset=", "model=", "seed="))]
    done = subprocess.run([sys.executable, "-m", "swalab.results.row", "--dataset", "digits", "--model", "preresnet20",
                           "--seeds", "0", "--no-fge", *tiny, f"paths.output_dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    [record] = row_records([tmp_path / "out"])
    assert all(not Path(job["run_dir"]).is_absolute() for job in record["jobs"])
    trunk_config = Path(record["jobs"][0]["run_dir"]).parent.name
    assert [p.name for p in (tmp_path / "out" / "rows").iterdir()] == [f"digits_preresnet20_{trunk_config}_seed0.json"]
    shutil.move(tmp_path / "out", tmp_path / "moved")
    [record] = row_records([tmp_path / "moved"])
    cost = row_cost(record)
    swa = next(job for job in record["jobs"] if job["name"] == "swa")
    assert swa["branch_epoch"] == 2 and cost["epochs"] == B + (round(1.5 * B) - 2)  # trunk 4, SWA's own 4
    assert cost["naive_epochs"] == B + B + round(1.25 * B) + round(1.5 * B)  # SGD, SWA 1 / 1.25 / 1.5 B
    shutil.copy(next((tmp_path / "moved" / "rows").iterdir()), tmp_path / "moved" / "rows" / "a_copy.json")
    report([tmp_path / "moved"], tmp_path / "rep")  # two records of the same runs: one row of the table
    table = (tmp_path / "rep" / "table.md").read_text()
    assert "## Wall time of the branched rows" in table and table.count(f"| 0 | {cost['epochs']} |") == 1


def test_the_row_summary_keeps_its_columns_aligned_for_long_column_names():
    from swalab.results.row import format_row

    scores = {"acc": 78.0, "nll": 0.7, "ece": 0.08}
    lines = format_row({"SGD": {**scores, "epoch": 30}, "SWAG-diag 1.5B": {**scores, "epoch": 45}}).splitlines()
    assert len({line.index("78.00") for line in lines[1:]}) == 1
    assert lines[0].index("epochs") + len("epochs") == lines[1].index("30") + 2


PAUSING_JOB = """
import os, signal, sys, time
from pathlib import Path

def pause(signum, frame):  # as run.py pauses: a checkpoint written at its step, then exit
    time.sleep(1)
    Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(75)

signal.signal(signal.SIGTERM, pause)
os.kill(os.getppid(), signal.SIGTERM)  # the row is stopped (kill, a job's time limit) while this job trains
time.sleep(60)
"""


def test_a_row_stopped_while_a_job_trains_hands_the_signal_on_and_waits_for_the_job_to_pause(tmp_path):
    """``kill`` of the row reached the row alone: it ended at once and its job trained on without it; Ctrl-C
    reached both, and the row killed the job 0.25 s later, before its checkpoint was written. The job is handed the
    signal and the row waits for its pause."""
    from swalab.cli import Terminated, sigterm_raises
    from swalab.results.row import Job, run_jobs

    paused = tmp_path / "paused"

    class Training(Job):
        def command(self) -> list[str]:
            return [sys.executable, "-c", PAUSING_JOB, str(paused)]

    with sigterm_raises(lambda signum: Terminated()), pytest.raises(Terminated):
        run_jobs([Training("swa", [], tmp_path / "run")])
    assert paused.read_text() == "SIGTERM"
