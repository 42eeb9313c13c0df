"""The OOD sets of ``python -m swalab.results.score --ood``: split-class (``dataset.classes``: train on some classes,
the others' test images out-of-distribution, as the SWAG paper's split CIFAR-10), an image folder (Imagenette at the
run's size), and noise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swalab.data.classes import ClassesError, check_classes, keep_classes, other_classes
from swalab.data.splits import DataSplit, ImageData
from swalab.results import ood
from swalab.results.score import main
from swalab.train import train

IMAGENETTE = Path(__file__).resolve().parents[2] / "shared" / "data" / "imagenette" / "val"
TINY = ["dataset.train_size=120", "dataset.val_size=40", "trainer.batch_size=32", "run.eval_every=0", "trainer.epochs=2",
        "method=sgd"]


def tiny_data() -> ImageData:
    split = lambda n: DataSplit(torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous(),
                                torch.arange(n) % 4)
    return ImageData("t", split(12), split(8), 4, ["a", "b", "c", "d"], val=split(4))


def test_keep_classes_keeps_their_images_in_every_split_relabelled_in_the_order_given():
    data = keep_classes(tiny_data(), [2, 0])
    assert data.num_classes == 2 and data.classes == ["c", "a"]
    assert data.train.labels.tolist() == [1, 0, 1, 0, 1, 0] and data.train.images[:, 0, 0, 0].tolist() == [0, 2, 4, 6, 8, 10]
    assert len(data.test) == 4 and data.val.labels.tolist() == [1, 0]
    assert keep_classes(tiny_data(), None).num_classes == 4


def test_other_classes_are_the_test_images_of_the_classes_left_out():
    out = other_classes(tiny_data(), [2, 0])
    assert out.labels.tolist() == [1, 3, 1, 3] and out.images[:, 0, 0, 0].tolist() == [1, 3, 5, 7]


@pytest.mark.parametrize("classes", [[0], [0, 1, 2, 3], [0, 0, 1], [0, 4]])
def test_classes_that_are_no_proper_subset_are_refused_saying_what_to_give(classes):
    with pytest.raises(ClassesError, match=r"dataset.classes=.*give two or more distinct class indices in 0..3"):
        check_classes(classes, 4)


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    from conftest import train_on_one_thread

    root = tmp_path_factory.mktemp("split")
    return train_on_one_thread(root / "sgd", *TINY, "dataset.classes=[0,1,2,3,4]", f"run.cache_dir={root / 'cache'}")


def test_a_split_class_run_has_five_outputs_and_detects_the_other_five_classes(split_run, capsys):
    result = main([str(split_run), "--ood", "other-classes", "--ood", "noise:gaussian", "--device", "cpu"])
    held_out, noise = result[str(split_run)]["ood"]
    assert held_out["data"]["name"] == "ood-other-classes"
    assert held_out["data"]["in_distribution"] + held_out["data"]["out_of_distribution"] == 360  # the digits test split
    assert 0.0 <= held_out["predictors"]["sgd"]["msp"]["auroc"] <= 1.0 and noise["predictors"]["sgd"]
    assert (split_run / "scores" / "ood-other-classes" / "metrics.json").is_file()
    final = torch.load(split_run / "final.pt", map_location="cpu", weights_only=False)
    heads = [v for k, v in final["model"].items() if k.endswith("weight") and v.dim() == 2]
    assert heads[-1].shape[0] == 5


@pytest.mark.skipif(not IMAGENETTE.is_dir(), reason=f"{IMAGENETTE} is not there (shared data)")
def test_imagenette_downsampled_to_the_runs_size_is_an_ood_set(split_run):
    record = main([str(split_run), "--ood", f"folder:{IMAGENETTE}", "--device", "cpu"])[str(split_run)]["ood"][0]
    assert record["data"]["name"] == ood.spec_name(f"folder:{IMAGENETTE}") and record["data"]["out_of_distribution"] == 180
    assert record["data"]["name"].startswith("ood-folder-val-")


def test_other_classes_of_a_run_trained_on_every_class_is_refused(tmp_path):
    from conftest import CONF_DIR, QUIET
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*QUIET, *TINY, "trainer.epochs=1", "dataset.val_size=null",
                                                       f"run.cache_dir={tmp_path / 'cache'}"])
    train(cfg, run_dir=tmp_path / "all")
    with pytest.raises(ClassesError, match=r"trained on every class \(dataset.classes is not set\)"):
        main([str(tmp_path / "all"), "--ood", "other-classes", "--device", "cpu"])
