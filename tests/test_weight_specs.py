"""One reading of a weight spec, ``<path>[@<epoch>][:<name>]``, for every command that takes one: the epoch and the name
are read from the end, so a run directory whose path holds ``@`` or ``:`` (a grid's ``lr@0.1`` folder) is named the
same way to ``model.init_from``, ``run.branch_from``, the analyses and ``runweights.load_weights``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import train_on_one_thread
from swalab.branching import BranchError, parse_spec
from swalab.config import ConfigError
from swalab.rundir import WeightSpec
from swalab.runweights import load_init_weights, load_weights, run_of

TINY = ["dataset.train_size=64", "trainer.batch_size=32", "trainer.epochs=2", "model.arch.depth=8",
        "run.eval_every=0", "method=sgd", "run.save_at=[1]"]


@pytest.mark.parametrize("spec, path, epoch, name", [
    ("runs/a", "runs/a", None, ""),
    ("runs/a@30", "runs/a", 30, ""),
    ("runs/a@0", "runs/a", 0, ""),
    ("runs/a:swa", "runs/a", None, "swa"),
    ("runs/a@30:ema", "runs/a", 30, "ema"),
    ("runs/lr@0.1/seed0@30", "runs/lr@0.1/seed0", 30, ""),   # '@' inside the path stays in the path
    ("runs/t:1/seed0:swa", "runs/t:1/seed0", None, "swa"),   # so does ':'
    ("runs/a@x", "runs/a@x", None, ""),                      # no digits after '@': no epoch
    ("final.pt", "final.pt", None, ""),
])
def test_a_spec_reads_its_epoch_and_name_from_the_end_and_writes_back_as_typed(spec, path, epoch, name):
    weights = WeightSpec.parse(spec)
    assert (weights.path, weights.epoch, weights.name) == (Path(path), epoch, name)
    assert str(weights.path) + weights.suffix() == spec


@pytest.fixture(scope="module")
def run_with_at_in_its_path(tmp_path_factory) -> Path:
    """A finished run (checkpoint of epoch 1 kept) in a folder named like a grid's: ``lr@0.1/t:1/seed0``."""
    return train_on_one_thread(tmp_path_factory.mktemp("grid") / "lr@0.1" / "t:1" / "seed0", *TINY)


def test_a_run_whose_path_holds_at_and_colon_is_found_by_every_reader(run_with_at_in_its_path):
    run = run_with_at_in_its_path
    assert run_of(f"{run}@1") == run
    assert run_of(f"{run}:sgd") == run
    final = load_weights(str(run))
    at_one = load_weights(f"{run}@1")
    assert set(final) == set(at_one)
    assert not all(torch.equal(final[k], at_one[k]) for k in final)  # epoch 1 is not the end of a 2-epoch run
    init, lineage = load_init_weights(f"{run}@1")
    assert lineage["epoch"] == 1 and all(torch.equal(init[k], at_one[k]) for k in init)
    assert parse_spec(f"{run}@1") == (run, 1)


def test_an_analysis_log_stores_a_spec_with_at_in_its_path_relative_and_keeps_the_epoch(run_with_at_in_its_path):
    run = run_with_at_in_its_path
    assert WeightSpec.parse(f"{run}@1:swa").relative_to(run.parent) == "seed0@1:swa"
    assert WeightSpec.parse(str(run)).relative_to(run.parent.parent) == "t:1/seed0"


def test_a_method_name_where_init_from_reads_only_a_run_s_last_weights_is_refused_in_one_line(
        run_with_at_in_its_path):
    with pytest.raises(ConfigError, match=r"model.init_from=.*':swa' is not read here"):
        load_init_weights(f"{run_with_at_in_its_path}:swa")


@pytest.mark.parametrize("spec", ["runs/a", "runs/a@x", "runs/a@3:swa"])
def test_a_branch_point_without_an_epoch_or_with_a_method_name_is_refused(spec):
    with pytest.raises(BranchError, match="must be <run dir>@<epoch>"):
        parse_spec(spec)


@pytest.mark.parametrize("reader, spec_of, damaged", [
    ("init_from", lambda run: str(run), lambda run: run / "final.pt"),
    ("init_from", lambda run: f"{run}@1", lambda run: next((run / "checkpoints").rglob("epoch0001.pt"))),
    ("branch_from", lambda run: f"{run}@1", lambda run: next((run / "checkpoints").rglob("epoch0001.pt"))),
])
def test_weights_cut_short_are_refused_in_one_line_naming_the_file_and_what_to_do(
        run_with_at_in_its_path, tmp_path, reader, spec_of, damaged):
    """A run's final.pt or kept checkpoint cut short (a kill, a full disk, a copy) is named, and the way on is said."""
    import shutil

    from swalab.branching import load_branch_state
    from swalab.checkpoint import CheckpointError

    run = tmp_path / "lr@0.1" / "seed0"
    shutil.copytree(run_with_at_in_its_path, run)
    path = damaged(run)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(CheckpointError) as refused:
        load_init_weights(spec_of(run)) if reader == "init_from" else load_branch_state(spec_of(run), {})
    said = str(refused.value)
    assert "\n" not in said and said.startswith(("model.init_from=" if reader == "init_from" else "run.branch_from=")
                                               + spec_of(run))
    assert f"{path} is damaged (" in said
    assert ("or train that run again" if reader == "init_from" else "or train the trunk again") in said


def test_a_finished_run_whose_metrics_file_was_removed_says_to_re_run_its_command_not_to_wait(tmp_path):
    """status.json says complete and no process trains the run, but its metrics.json is gone (moved away by hand): the
    run's own command trains it again, so score, compare, posthoc and model.init_from say that; "wait for it to
    finish" would wait for ever."""
    from swalab.rundir import RunDir
    from swalab.runweights import unfinished

    run = tmp_path / "sgd" / "seed0"
    run.mkdir(parents=True)
    RunDir(run).write_status({"status": "complete"})
    said = unfinished(run)
    assert said.startswith(f"{run} has not finished (") and "metrics.json" in said
    assert said.endswith("re-run its own command to finish it") and "wait" not in said
