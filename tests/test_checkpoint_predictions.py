"""Checkpoints hold weights and state; the test-set predictions a method keeps live in files of their own.

FGE keeps each member's test log-probabilities and SWA its average's at every budget mark (``score_at_budgets``).
A checkpoint used to carry all of them, again every epoch (200 MB per FGE member on ImageNet). Now each is written
once, when computed, to ``checkpoints/predictions/`` (``swalab.checkpoint.PredictionFiles``); a checkpoint names
them, and a resume reads them back and ends equal to the run that went straight through. A checkpoint of an
earlier swalab, with the predictions inside, is rewritten by ``python -m swalab.upgrade`` and then resumes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from swalab import checkpoint, faults, upgrade
from swalab.checkpoint import CheckpointStore, PredictionFiles, checkpoint_paths
from swalab.data import ResidentLoader
from swalab.methods import FGE, SWA
from swalab.schedules import Constant
from swalab.pausing import Preempted
from swalab.trainer import Trainer, TrainerOptions
from test_rank_agreement import bn_model, toy_data

EPOCHS = 6
CPU = torch.device("cpu")


def method(name: str):
    lr = Constant(lr=0.05)
    if name == "fge":  # members after epochs 2, 4, 6
        return FGE(lr, EPOCHS, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=1)
    return SWA(lr, EPOCHS, lr=0.02, start_epoch=1, score_at_budgets=[0.5, 1.0])  # marks after epochs 3 and 6


def trainer(run_dir: Path, name: str, **options) -> Trainer:
    common = dict(device=CPU, mean=[0.5], std=[0.25])
    train = ResidentLoader(toy_data(), 32, train=True, pad=1, flip=False, seed=3, **common)
    test = ResidentLoader(toy_data(150), 64, train=False, **common)
    bn = ResidentLoader(toy_data(), 32, train=True, pad=1, flip=False, seed=4, drop_last=False, **common)
    opts = TrainerOptions(epochs=EPOCHS, progress=False, keep_checkpoints=10, **{"handle_signals": False, **options})
    return Trainer(bn_model(), method(name), train, test, bn, CPU, run_dir, opts)


def predictions_in(state) -> list[str]:
    """Paths of every tensor in a method state that has the test set's shape (150 images x 4 classes)."""
    found = []

    def walk(node, path):
        if isinstance(node, torch.Tensor) and node.shape == (150, 4):
            found.append(path)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
    walk(state, "method")
    return found


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """Each method's run straight through, counting every file written."""
    runs = {}
    for name in ("fge", "swa"):
        run_dir = tmp_path_factory.mktemp(name)
        written: list[str] = []
        real = checkpoint.atomic_save

        def counting(obj, path):
            written.append(Path(path).relative_to(run_dir).as_posix())
            return real(obj, path)
        checkpoint.atomic_save = counting
        try:
            t = trainer(run_dir, name)
            metrics = t.fit().metrics
        finally:
            checkpoint.atomic_save = real
        runs[name] = {"dir": run_dir, "written": written, "metrics": metrics, "model": t.model.state_dict()}
    return runs


@pytest.mark.parametrize("name, files", [("fge", ["fge_member_001", "fge_member_002", "fge_member_003"]),
                                         ("swa", ["swa@0.5", "swa@1"])])
def test_every_prediction_is_written_once_and_no_checkpoint_carries_one(straight, name, files):
    run = straight[name]
    predictions = [w for w in run["written"] if w.startswith("checkpoints/predictions/")]
    assert predictions == [f"checkpoints/predictions/{f}.pt" for f in files]  # each once, in the order computed
    assert len([w for w in run["written"] if w.startswith("checkpoints/epoch")]) == EPOCHS
    for path in checkpoint_paths(run["dir"] / "checkpoints"):
        state = torch.load(path, weights_only=False)
        assert predictions_in(state["method"]) == [], path.name
    last = torch.load(run["dir"] / "checkpoints" / f"epoch{EPOCHS:04d}.pt", weights_only=False)["method"]
    assert last.get("member_files", last.get("budget_files")) == files


def pause_and_resume(run_dir: Path, name: str, monkeypatch, earlier_layout: bool = False) -> Trainer:
    """The run paused by SIGTERM at step 2 of epoch 5 (a member or mark already scored), then resumed; with
    ``earlier_layout`` its checkpoints are first rewritten as an earlier swalab wrote them (predictions inside), then
    upgraded (``swalab.upgrade``)."""
    monkeypatch.setenv(faults.ENV, "train_step:22:TERM")  # 5 steps an epoch: epoch 5, step 2
    faults.reset()
    with pytest.raises(Preempted):
        trainer(run_dir, name, handle_signals=True).fit()
    monkeypatch.delenv(faults.ENV)
    if earlier_layout:
        files = PredictionFiles(run_dir)
        for path in checkpoint_paths(run_dir / "checkpoints"):
            state = torch.load(path, weights_only=False)
            m = state["method"]
            if "member_files" in m:
                m["member_log_probs"] = [files.load(n) for n in m.pop("member_files")]
            else:
                m["budget_log_probs"] = {n: files.load(n) for n in m.pop("budget_files")}
            torch.save(state, path)
        shutil.rmtree(files.dir)
        with pytest.raises(checkpoint.CheckpointError, match="python -m swalab.upgrade"):
            trainer(run_dir, name).fit(CheckpointStore(run_dir).latest())
        assert upgrade.main([str(run_dir), "--write"]) == 0
    torch.manual_seed(12345)
    resumed = trainer(run_dir, name)
    resumed.fit(CheckpointStore(run_dir).latest())
    return resumed


@pytest.mark.parametrize("name", ["fge", "swa"])
@pytest.mark.parametrize("earlier_layout", [False, True], ids=["today", "earlier-layout"])
def test_a_resume_reads_the_predictions_back_and_ends_equal(tmp_path, straight, monkeypatch, name, earlier_layout):
    run_dir = tmp_path / "run"
    resumed = pause_and_resume(run_dir, name, monkeypatch, earlier_layout)
    assert resumed.evaluate().metrics == straight[name]["metrics"]
    for key, value in straight[name]["model"].items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
    for path in (run_dir / "checkpoints" / "predictions").iterdir():  # the files equal the straight run's
        assert torch.equal(torch.load(path), torch.load(straight[name]["dir"] / "checkpoints" / "predictions" / path.name))


def test_a_missing_prediction_file_is_named(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "train_step:22:TERM")
    faults.reset()
    with pytest.raises(Preempted):
        trainer(run_dir, "fge", handle_signals=True).fit()
    monkeypatch.delenv(faults.ENV)
    (run_dir / "checkpoints" / "predictions" / "fge_member_001.pt").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=r"fge_member_001\.pt is missing: the checkpoint names it"):
        trainer(run_dir, "fge").fit(CheckpointStore(run_dir).latest())
