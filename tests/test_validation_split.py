"""``dataset.val_size``: a validation split held out of the training images, class-balanced, the same for every seed
and method, part of a run's identity only when set, and never seen by training or by a BN update."""

from __future__ import annotations

import json
import re

import pytest
import torch
from omegaconf import OmegaConf

from swalab.data import load_cifar, load_digits, load_folder, subset
from swalab.data.imagenet import load_imagenet
from swalab.data.splits import VAL_SPLIT_SEED, DataSplit, hold_out, split_off_val, stratified_permutation, val_count
from swalab.identity import identity_of
from swalab.train import train
from swalab.train.build import build_loaders, build_val_loader

from test_data import CIFAR10_NAMES, _ids, _indexed_split, write_cifar10_pickles
from test_folder_data import write_folder
from test_imagenet import tiny_imagenet  # noqa: F401  (a fixture)

QUIET = ["logger=none", "run.progress=false"]


# -- the split itself ------------------------------------------------------------------------------------------
def test_a_count_or_a_fraction_holds_out_that_many_images_and_null_or_zero_none():
    assert [val_count(v, 1000) for v in (None, 0, 0.0, 250, 0.25, 0.1234)] == [0, 0, 0, 250, 250, 123]


@pytest.mark.parametrize("value, message", [
    (1000, "holds out 1000 of the 1000 training images, leaving none to train on: lower dataset.val_size below 1000"),
    (1.0, "a fraction of the training images must lie in (0, 1), a number of images must be an integer"),
    (5000.0, "write 5000, not 5000.0"),
    (float("nan"), "dataset.val_size=nan: a fraction of the training images must lie in (0, 1)"),
    (-3, "dataset.val_size=-3 must be >= 0"),
    (True, "dataset.val_size=True must be a number of images (an integer), a fraction in (0, 1), or null"),
    ("half", "dataset.val_size='half' must be a number of images"),
    (0.0001, "is 0.0001 of 1000 training images: not one image"),
])
def test_a_validation_split_that_cannot_work_is_refused_naming_the_key(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        val_count(value, 1000)


def test_the_split_is_class_balanced_disjoint_from_training_and_keeps_the_original_order():
    split = _indexed_split(1000, 10)
    train, val = split_off_val(split, 200)
    assert torch.bincount(val.labels, minlength=10).tolist() == [20] * 10
    assert sorted(_ids(train) + _ids(val)) == list(range(1000)) and not set(_ids(train)) & set(_ids(val))
    assert _ids(val) == sorted(_ids(val)) and _ids(train) == sorted(_ids(train))
    assert split_off_val(split, None) == (split, None)


def test_a_split_that_would_take_every_image_of_a_class_is_refused_naming_it():
    labels = torch.tensor([0] * 50 + [1] * 50 + [2])  # class 2 has one training image
    taken = int((stratified_permutation(labels, VAL_SPLIT_SEED) == 100).nonzero()) + 1  # the split that reaches it
    assert 2 in labels[hold_out(labels, taken - 1)[0]].tolist()
    with pytest.raises(ValueError, match=r"dataset.val_size=\d+ would hold out every training image of class bird"):
        hold_out(labels, taken, classes=["airplane", "automobile", "bird"])


def test_a_split_too_small_to_hold_every_class_is_refused_naming_the_smallest_that_does():
    """One image of one class fits a temperature to its search bound (swa+ts NLL 10.9 against 1.96): the split must
    hold at least one image of every class the training images hold, and the refusal says how many that takes."""
    labels = torch.arange(1000) % 10
    with pytest.raises(ValueError, match=re.escape(
            "dataset.val_size=1 holds out 1 image, of 1 of the 10 classes: too few to fit the temperature of the +ts "
            "predictors on. Hold out at least one image of every class: dataset.val_size=10 or more (null: no "
            "validation split)")):
        hold_out(labels, 1)
    with pytest.raises(ValueError, match=r"dataset.val_size=9 holds out 9 images, of 9 of the 10 classes"):
        hold_out(labels, 9)
    assert torch.bincount(labels[hold_out(labels, 10)[1]]).tolist() == [1] * 10  # the smallest split accepted
    rare = torch.tensor([0] * 180 + [1] * 18 + [2] * 2)  # a rare class appears late in the stratified order
    labels_in_order = rare[stratified_permutation(rare, VAL_SPLIT_SEED)]
    needed = max(int((labels_in_order == c).nonzero()[0]) for c in range(3)) + 1
    assert needed > 3 and sorted(set(rare[hold_out(rare, needed)[1]].tolist())) == [0, 1, 2]
    with pytest.raises(ValueError, match=rf"of 2 of the 3 classes: .* dataset.val_size={needed} or more"):
        hold_out(rare, needed - 1)


def test_the_cli_refuses_a_validation_split_of_one_image_in_one_line_writing_nothing(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run([sys.executable, str(REPO / "run.py"), *QUIET, "trainer.epochs=2", "dataset.val_size=1",
                           f"paths.output_dir={tmp_path / 'out'}"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "[swalab] dataset.val_size=1 holds out 1 image, of 1 of the 10 classes: too few to fit the temperature of the "
        "+ts predictors on. Hold out at least one image of every class: dataset.val_size=10 or more (null: no "
        "validation split)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_digits_hold_out_the_same_images_for_every_seed_and_train_size_picks_from_the_rest():
    a, b = load_digits(seed=0, val_size=200), load_digits(seed=3, val_size=200, train_size=500)
    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.val.labels, b.val.labels)
    assert len(a.train) == 1437 - 200 and len(b.train) == 500 and len(a.val) == 200
    assert torch.bincount(a.val.labels, minlength=10).min() >= 19  # class-balanced
    full = load_digits()
    assert torch.equal(a.test.images, full.test.images) and full.val is None  # the test set never moves
    rest, _ = split_off_val(full.train, 200)
    assert torch.equal(b.train.images, subset(rest, 500, seed=3).images)  # train_size's subset of what is left
    with pytest.raises(ValueError, match=r"dataset.train_size=1300 is out of range: the training split less the "
                                         r"200 validation images \(dataset.val_size\) has 1237 items"):
        load_digits(val_size=200, train_size=1300)
    assert len(load_digits(val_size=0.1).val) == round(0.1 * 1437)


# -- every loader ------------------------------------------------------------------------------------------------
def test_cifar_pickles_and_image_folders_hold_out_the_same_images_decoding_only_the_chosen(tmp_path):
    write_cifar10_pickles(tmp_path / "pickles", per_batch=20)  # 100 training images
    pickles = [load_cifar("cifar10", tmp_path / "pickles", download=False, val_size=20, train_size=40, seed=s)
               for s in (0, 1)]
    assert len(pickles[0].val) == 20 and torch.equal(pickles[0].val.images, pickles[1].val.images)
    assert not torch.equal(pickles[0].train.images, pickles[1].train.images)  # train_size follows the seed
    root = write_folder(tmp_path / "folder", CIFAR10_NAMES, n_train=6, n_test=2, size=(32, 32))
    whole = load_cifar("cifar10", root, download=False)
    part = load_cifar("cifar10", root, download=False, val_size=20, train_size=30, seed=2)
    train, val = split_off_val(whole.train, 20)
    assert torch.equal(part.val.images, val.images) and torch.equal(part.val.labels, val.labels)
    assert torch.equal(part.train.images, subset(train, 30, seed=2).images)
    again = load_cifar("cifar10", root, download=False, val_size=20, train_size=30, seed=2)  # from its own cache
    assert torch.equal(again.val.images, part.val.images) and again.cache_note is None
    assert load_cifar("cifar10", root, download=False, train_size=30, seed=2).val is None  # its own cache file too


def test_a_folder_measures_its_normalisation_without_the_validation_images(tmp_path):
    root = write_folder(tmp_path, ["a", "b", "c"], n_train=8, n_test=2, size=(5, 5))
    data = load_folder(root, val_size=6, cache=False)
    assert len(data.train) == 18 and len(data.val) == 6 and torch.bincount(data.val.labels).tolist() == [2, 2, 2]
    whole = load_folder(root, cache=False)
    train, val = split_off_val(whole.train, 6, whole.classes)
    assert torch.equal(data.val.images, val.images) and torch.equal(data.train.images, train.images)
    measured = train.images.double() / 255
    assert data.mean == pytest.approx(measured.mean(dim=(0, 2, 3)).tolist(), abs=1e-9)
    assert data.mean != pytest.approx(whole.mean, abs=1e-9)


def test_imagenet_holds_out_train_images_and_keeps_val_as_the_test_set(tiny_imagenet):  # noqa: F811
    a, b = load_imagenet(tiny_imagenet, val_size=6, seed=0), load_imagenet(tiny_imagenet, val_size=6, seed=4)
    assert a.val.samples == b.val.samples and sorted(a.val.labels.tolist()) == [0, 0, 217, 217, 701, 701]
    assert not set(a.val.samples) & set(a.train.samples) and len(a.train) == 12
    assert a.test.samples == load_imagenet(tiny_imagenet).test.samples
    with pytest.raises(ValueError, match=r"dataset.train_size=13 is out of range: .* less the 6 validation images"):
        load_imagenet(tiny_imagenet, val_size=6, train_size=13)


# -- runs ----------------------------------------------------------------------------------------------------------
def test_val_size_counts_in_the_identity_only_when_set(make_cfg):
    def identity(*overrides):
        return identity_of(OmegaConf.to_container(make_cfg(*overrides), resolve=True))

    base = identity()
    assert "dataset.val_size" not in base  # runs made before the key existed keep their identity
    assert identity("dataset.val_size=0") == base and identity("dataset.val_size=null") == base
    assert identity("dataset.val_size=200")["dataset.val_size"] == 200 != identity("dataset.val_size=0.1").get(
        "dataset.val_size")


def test_the_bn_update_and_the_training_batches_read_the_training_images_only(make_cfg):
    cfg = make_cfg("dataset.val_size=300", "dataset.pad=0", "run.device=cpu")  # no crop: batches are the images
    data = load_digits(val_size=300)
    train_loader, _, bn_loader = build_loaders(cfg, data, torch.device("cpu"))
    val_loader = build_val_loader(cfg, data, torch.device("cpu"))

    def rows(loader):
        return sorted(tuple(x.flatten().tolist()) for batch, _ in loader for x in (batch * 0.376 + 0.305).mul(255).round())

    expected = sorted(tuple(x.flatten().tolist()) for x in data.train.images.float())
    assert rows(bn_loader) == expected  # the 1137 training images, no other
    assert set(rows(train_loader)) <= set(expected) and len(rows(train_loader)) == train_loader.num_samples
    assert val_loader.num_samples == 300 and torch.equal(torch.cat([y for _, y in val_loader]), data.val.labels)
    assert build_val_loader(make_cfg(), load_digits(), torch.device("cpu")) is None


def test_a_run_with_a_validation_split_records_it_and_its_metrics_hold_both_splits(make_cfg, tmp_path):
    cfg = make_cfg("method=sgd", "trainer.epochs=2", "model.arch.depth=8", "dataset.val_size=150", "run.device=cpu",
                   "run.eval_split=val")
    metrics = train(cfg, run_dir=tmp_path / "run")
    facts = json.loads((tmp_path / "run" / "data.json").read_text())
    assert facts["val_images"] == 150 and facts["train_images"] == 1437 - 150
    assert set(metrics["sgd"]["val"]) >= {"acc", "nll", "ece", "brier"} and "acc" in metrics["sgd"]
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert all("val_acc" in row and "test_acc" not in row for row in history)  # monitored on the validation split
    assert "sgd+ts" in metrics and metrics["sgd+ts"]["acc"] == metrics["sgd"]["acc"]


@pytest.mark.parametrize("overrides, message", [
    (["run.eval_split=val"], "run.eval_split=val monitors on the validation split, and this run has none: set "
                             "dataset.val_size="),
    (["run.temperature_scaling=true"], "run.temperature_scaling=true fits each temperature on the validation split, "
                                       "and this run has none: set dataset.val_size="),
    (["run.eval_split=train", "dataset.val_size=100"], "run.eval_split='train' must be test or val"),
    (["dataset.val_size=1437"], "dataset.val_size=1437 holds out 1437 of the 1437 training images"),
])
def test_what_needs_a_validation_split_is_refused_without_one_before_anything_is_written(make_cfg, tmp_path,
                                                                                          overrides, message):
    cfg = make_cfg("method=sgd", "trainer.epochs=1", "model.arch.depth=8", "run.device=cpu", *overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_split_of_a_split_is_a_data_split():
    split = DataSplit(images=torch.zeros(10, 1, 2, 2, dtype=torch.uint8), labels=torch.arange(10) % 2)
    train, val = split_off_val(split, 4)
    assert isinstance(train, DataSplit) and isinstance(val, DataSplit) and len(train) == 6


def test_a_split_that_would_empty_a_class_names_the_largest_that_leaves_each_class_a_training_image():
    labels = torch.tensor([0] * 20 + [1] * 5 + [2] * 9)
    refusal = r"leaving it nothing to train on: lower dataset.val_size to \d+ or less"
    with pytest.raises(ValueError, match=refusal) as refused:
        hold_out(labels, 33)
    most = int(re.search(r"to (\d+) or less", str(refused.value)).group(1))
    train, val = hold_out(labels, most)  # the largest named is taken: every class keeps a training image
    assert len(val) == most and set(labels[train].tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="leaving it nothing to train on"):
        hold_out(labels, most + 1)
