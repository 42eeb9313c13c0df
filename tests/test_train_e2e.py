"""A whole run through swalab.train.train on CPU: the run directory, resume, and the real CIFAR-10 JPEGs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from swalab.checkpoint import CheckpointError, checkpoint_paths
from swalab.config import ConfigError
from swalab.train import train

TINY = ["dataset.train_size=256", "model.budget_epochs=3", "trainer.batch_size=64"]


def read_history(run_dir):
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def test_tiny_sgd_run_writes_a_self_describing_run_dir(make_cfg, tmp_path):
    metrics = train(make_cfg("method=sgd", *TINY), run_dir=tmp_path)
    assert set(metrics) == {"sgd"} and set(metrics["sgd"]) >= {"acc", "nll", "ece"}
    assert 0 <= metrics["sgd"]["acc"] <= 100 and metrics["sgd"]["nll"] > 0
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    rows = read_history(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert {"epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "seconds"} <= set(rows[-1])
    assert rows[-1]["test_acc"] == pytest.approx(metrics["sgd"]["acc"], abs=1e-4)
    assert rows[-1]["test_loss"] == pytest.approx(metrics["sgd"]["nll"], rel=1e-6)  # one NLL: the epoch's line
    assert (tmp_path / "config.yaml").read_text().count("num_classes: 10") >= 1
    assert "commit" in json.loads((tmp_path / "git.json").read_text())
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "complete"
    assert not checkpoint_paths(tmp_path / "checkpoints")  # final.pt supersedes them (run.keep_finished_checkpoints)
    assert torch.load(tmp_path / "final.pt", weights_only=False)["epoch"] == 3
    saved = torch.load(tmp_path / "predictions.pt", weights_only=False)  # what analyses read without weights
    accuracy = 100 * saved["probs"]["sgd"].float().argmax(1).eq(saved["labels"]).float().mean().item()
    assert accuracy == pytest.approx(metrics["sgd"]["acc"], abs=0.3)  # float16 probabilities: ties may flip


def test_a_finished_run_is_skipped_not_retrained(make_cfg, tmp_path, caplog):
    first = train(make_cfg("method=sgd", *TINY), run_dir=tmp_path)
    mtime = (tmp_path / "final.pt").stat().st_mtime_ns
    again = train(make_cfg("method=sgd", *TINY), run_dir=tmp_path)
    assert again == first
    assert (tmp_path / "final.pt").stat().st_mtime_ns == mtime
    assert "already holds a finished run of this config; skipping" in caplog.text


def test_resume_after_interruption_gives_the_same_final_weights(make_cfg, tmp_path):
    """Run straight through; then 'interrupt' a copy after epoch 2 of 5 and resume: identical weights."""
    overrides = ["method=swa", "dataset.train_size=256", "model.budget_epochs=4", "method.budget=1.25", "model.swa.start_epoch=3",
                 "trainer.batch_size=64", "run.keep_checkpoints=10", "run.keep_finished_checkpoints=true"]
    straight = tmp_path / "straight"
    train(make_cfg(*overrides), run_dir=straight)
    interrupted = tmp_path / "interrupted"
    shutil.copytree(straight, interrupted)
    for name in ("metrics.json", "final.pt"):
        (interrupted / name).unlink()
    for path in checkpoint_paths(interrupted / "checkpoints")[:-2]:  # keep epochs 1 and 2 only
        path.unlink()
    resumed = train(make_cfg(*overrides), run_dir=interrupted)
    a = torch.load(straight / "final.pt", weights_only=False)
    b = torch.load(interrupted / "final.pt", weights_only=False)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in a["methods"]["swa"]:
        assert torch.equal(a["methods"]["swa"][key], b["methods"]["swa"][key]), key
    assert resumed == json.loads((straight / "metrics.json").read_text())
    assert [r["epoch"] for r in read_history(interrupted)] == [1, 2, 3, 4, 5]


def test_a_checkpoint_of_another_run_is_refused(make_cfg, tmp_path):
    train(make_cfg("method=sgd", *TINY, "run.keep_finished_checkpoints=true"), run_dir=tmp_path)
    for name in ("metrics.json", "identity.json", "config.yaml"):  # only the checkpoints say whose run it was
        (tmp_path / name).unlink()
    with pytest.raises(CheckpointError, match=r"another config \(seed: 0 there, 1 here\)"):
        train(make_cfg("method=sgd", *TINY, "seed=1"), run_dir=tmp_path)


def test_a_run_directory_refuses_another_config_naming_the_keys(make_cfg, tmp_path):
    train(make_cfg("method=sgd", *TINY), run_dir=tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match=r"holds a run of another config \(trainer\.epochs: 3 there, 2 here\)"):
        train(make_cfg("method=sgd", *TINY, "trainer.epochs=2"), run_dir=tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before  # nothing touched


def test_bad_init_weights_name_the_missing_keys(make_cfg, tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"conv.weight": torch.zeros(1)}, bad)
    with pytest.raises(CheckpointError, match="missing keys"):
        train(make_cfg("method=sgd", *TINY, f"model.init_from={bad}"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before training: nothing left behind


def test_fge_and_ema_runs_score_their_own_predictors(make_cfg, tmp_path):
    fge = train(make_cfg("method=fge", *TINY, "model.budget_epochs=4", "model.fge.pretrain_epochs=2"), run_dir=tmp_path / "f")
    assert fge["fge"]["members"] == 1 and len(fge["fge"]["curve"]) == 1
    ema = train(make_cfg("method=ema", *TINY), run_dir=tmp_path / "e")
    assert set(ema) == {"ema", "sgd"}


@pytest.mark.slow
def test_real_cifar10_jpeg_subset_learns(make_cfg, tmp_path, cifar10_jpg):
    """PreResNet-20 on 2,000 real CIFAR-10 training images beats chance clearly after 3 epochs."""
    cache_root = tmp_path / "data"
    metrics = train(make_cfg("dataset=cifar10", f"dataset.root={cifar10_jpg}", f"run.cache_dir={cache_root}",
                             "dataset.train_size=2000", "model=preresnet20", "method=sgd", "trainer.epochs=3",
                             "run.eval_every=0"), run_dir=tmp_path / "run")
    assert metrics["sgd"]["acc"] > 20.0  # chance is 10%


BN1D = ["model=custom", "model.arch._target_=bn1d_net.FlatBN", "trainer.epochs=2", "method=swa",
        "model.swa.start_epoch=1", "run.channels_last=false"]


def test_a_last_batch_of_one_image_is_folded_so_batchnorm1d_trains_and_updates(make_cfg, tmp_path):
    # 129 images in batches of 128 left a last batch of 1: BatchNorm1d failed in epoch 1 (and in the BN update)
    metrics = train(make_cfg(*BN1D, "dataset.train_size=129", "trainer.batch_size=128"), run_dir=tmp_path)
    assert set(metrics) == {"swa", "sgd"}


def test_a_model_that_cannot_train_on_one_image_is_refused_before_training(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"FlatBN cannot train on a batch of one image .*raise trainer.batch_size"):
        train(make_cfg(*BN1D, "dataset.train_size=16", "trainer.batch_size=1"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_resident_loader_folds_only_a_last_training_batch_of_one():
    from swalab.data import DataSplit, ResidentLoader

    def sizes(n, train):
        split = DataSplit(torch.zeros(n, 1, 4, 4, dtype=torch.uint8), torch.zeros(n, dtype=torch.int64))
        loader = ResidentLoader(split, 4, "cpu", [0.0], [1.0], train=train, pad=0, drop_last=False)
        return [len(y) for _, y in loader]

    assert sizes(9, train=True) == [4, 5]          # 4 + 4 + 1: the single image joins the batch before it
    assert sizes(10, train=True) == [4, 4, 2]
    assert sizes(9, train=False) == [4, 4, 1]      # evaluation keeps every batch as it is
    assert sizes(1, train=True) == [1]


def test_config_yaml_records_the_budget_the_run_trained_with(make_cfg, tmp_path):
    import yaml

    train(make_cfg("method=swa", "trainer.epochs=3", "model.swa.start_epoch=1", *TINY[:1]), run_dir=tmp_path)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["trainer"]["epochs"] == 3 and config["method"]["budget"] == 1.5
    assert config["model"]["budget_epochs"] == 2  # B = 3 / 1.5, not the model's 16 or 150
