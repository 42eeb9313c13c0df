"""``run.snapshots``: the live weights written as training goes (swalab.snapshots), for averages built afterwards.

Every run is the tiny SWA run of tests/test_reliability.py (PreResNet-8 on 256 digits, batch 64: 4 steps per epoch, 4
epochs, averaging from epoch 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from swalab.config import ConfigError
from swalab.identity import identity_of
from swalab.snapshots import per_epoch, snapshots_of
from swalab.train import train
from test_reliability import make_cfg, run_cli  # run_cli's children train on one thread: bit-equal runs

EPOCHS = 4


def names(run: Path) -> list[str]:
    return [s.path.name for s in snapshots_of(run)]


def test_snapshots_every_epoch_hold_the_live_weights_in_float32_and_the_last_is_the_final_live_model(tmp_path):
    run = tmp_path / "run"
    train(make_cfg("run.snapshots=1"), run_dir=run)
    assert names(run) == [f"epoch{e:04d}.pt" for e in range(1, EPOCHS + 1)]
    last = torch.load(run / "snapshots" / "epoch0004.pt", weights_only=True)
    assert (last["epoch"], last["step"], last["steps_per_epoch"]) == (EPOCHS, 0, 4)
    final = torch.load(run / "final.pt", weights_only=False)["model"]
    assert last["model"].keys() == final.keys()
    for key, value in final.items():
        assert torch.equal(last["model"][key], value.float() if value.is_floating_point() else value), key
    assert not (run / "snapshots" / "epoch0001.pt").read_bytes() == (run / "snapshots" / "epoch0002.pt").read_bytes()


def test_a_fraction_of_an_epoch_writes_that_many_snapshots_per_epoch_named_by_their_step(tmp_path):
    run = tmp_path / "run"
    train(make_cfg("run.snapshots=0.5", "trainer.epochs=2", "model.swa.start_epoch=0"), run_dir=run)
    assert names(run) == ["epoch0000_step000002.pt", "epoch0001.pt", "epoch0001_step000002.pt", "epoch0002.pt"]


def test_every_other_epoch_writes_the_even_epochs_only(tmp_path):
    run = tmp_path / "run"
    train(make_cfg("run.snapshots=2"), run_dir=run)
    assert names(run) == ["epoch0002.pt", "epoch0004.pt"]


def test_without_the_setting_no_snapshot_is_written(tmp_path):
    run = tmp_path / "run"
    train(make_cfg("trainer.epochs=2", "model.swa.start_epoch=0"), run_dir=run)
    assert not (run / "snapshots").exists()


@pytest.mark.parametrize("value", ["0.3", "1.5", "-1", "often"])
def test_a_snapshot_spacing_that_is_no_whole_epoch_count_nor_one_kth_of_one_is_refused_before_anything_is_written(
        tmp_path, value):
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=rf"run.snapshots={value!s}|run.snapshots='{value}'"):
        train(make_cfg(f"run.snapshots={value}"), run_dir=run)
    assert not run.exists()


def test_the_spacing_is_read_as_epochs_or_as_snapshots_per_epoch():
    assert per_epoch(None) == (0, 0)
    assert per_epoch(3) == (3, 1)
    assert per_epoch(0.25) == (1, 4)
    assert per_epoch(0.1) == (1, 10)


def test_snapshots_are_no_part_of_the_run_identity():
    def identity(*overrides):
        return identity_of(OmegaConf.to_container(make_cfg(*overrides), resolve=True))

    assert identity("run.snapshots=1") == identity() == identity("run.snapshots=0.25")


def test_a_run_killed_and_resumed_writes_each_snapshot_once_with_the_weights_of_a_run_never_killed(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run_cli(straight, "run.snapshots=0.5").returncode == 0
    first = run_cli(killed, "run.snapshots=0.5", fault="train_step:7")  # step 3 of epoch 2: after its mid-epoch one
    assert first.returncode != 0 and (killed / "snapshots" / "epoch0001_step000002.pt").exists()
    assert not (killed / "snapshots" / "epoch0002.pt").exists()
    resumed = run_cli(killed, "run.snapshots=0.5")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout + resumed.stderr
    assert names(killed) == names(straight) and len(names(straight)) == 2 * EPOCHS
    assert not list((killed / "snapshots").glob("*.tmp"))
    for a, b in zip(snapshots_of(killed), snapshots_of(straight)):
        wa, wb = a.weights(), b.weights()
        assert all(torch.equal(wa[k], wb[k]) for k in wb), a.path.name


@pytest.mark.parametrize("damage", ["cut short", "not torch's"])
def test_a_damaged_snapshot_is_named_in_one_line_with_what_to_do(tmp_path, damage):
    """A snapshot is written whole, so one that cannot be read was damaged since (a copy cut short, a full disk): the
    refusal says so and how to go on (move it aside: the averages then use the others), not only the loader's
    error."""
    from swalab.checkpoint import CheckpointError, atomic_save

    folder = tmp_path / "snapshots"
    folder.mkdir()
    atomic_save({"epoch": 3, "step": 0, "steps_per_epoch": 5, "model": {"w": torch.ones(1000)}}, folder / "epoch0003.pt")
    path = folder / "epoch0003.pt"
    path.write_bytes(path.read_bytes()[:600] if damage == "cut short" else b"garbage")
    (snapshot,) = snapshots_of(tmp_path)
    for read in (snapshot.weights, snapshot.steps_per_epoch):
        with pytest.raises(CheckpointError) as refused:
            read()
        said = str(refused.value)
        assert "\n" not in said and said.startswith(f"{path}: cannot read it")
        assert said.endswith(f"move it out of {folder} to average the other snapshots without it"), said
