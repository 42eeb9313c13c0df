"""Tests for load_folder (any image folder) and for decoding only the subset a load keeps.

Every folder here is written by the test itself with PIL, in real formats (PNG, JPEG; grey and RGB; odd
sizes; class counts other than 10 or 100). One test reads the JPEG copy of CIFAR-10 when it is present.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

import swalab.data.folder as folder_mod
from swalab.config import ConfigError
from swalab.train import validate
from swalab.data import ImageData, cap_test_split, load_cifar, load_folder, subset
from swalab.data.cache import CACHE_FORMAT_VERSION, cache_path, root_key
from swalab.train import prepare

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ----------------------------------------------------------------------------------------------- writers


def write_images(folder: Path, n: int, size: tuple[int, int] = (13, 17), grey: bool = False, fmt: str = "png",
                 seed: int = 0, first: int = 0) -> list[Path]:
    """``n`` random images of ``size`` (W, H) named ``NNN.fmt`` in ``folder``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(first, first + n):
        shape = (size[1], size[0]) if grey else (size[1], size[0], 3)
        path = folder / f"{i:03d}.{fmt}"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def write_folder(root: Path, classes: list[str], n_train: int = 4, n_test: int = 2, **kw) -> Path:
    """root/{train,test}/<class>/NNN.<fmt>, each class with its own pixels."""
    for k, name in enumerate(classes):
        write_images(root / "train" / name, n_train, seed=k, **kw)
        write_images(root / "test" / name, n_test, seed=100 + k, **kw)
    return root


def pil_pixels(path: Path, mode: str, resize: int | None = None) -> torch.Tensor:
    """What PIL itself makes of ``path``: a uint8 tensor [C, H, W]."""
    with Image.open(path) as im:
        im = im.convert(mode)
        if resize is not None:
            im = im.resize((resize, resize), Image.Resampling.BILINEAR)
        arr = np.asarray(im)
    arr = arr[:, :, None] if arr.ndim == 2 else arr
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def files_of(root: Path, split: str) -> list[Path]:
    """The image files of one split in the loader's order (sorted class folders, then sorted names)."""
    return sorted((root / split).glob("*/*.*"))


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
    """Every path decoded from now on, in the order decoding started."""
    seen: list[str] = []
    real = folder_mod._decode_image

    def counting(path, *args, **kwargs):
        seen.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(folder_mod, "_decode_image", counting)
    return seen


def forbid_reading_images(monkeypatch) -> None:
    """From now on any decode or header read fails the test: what follows must come from the cache."""

    def forbidden(path, *args, **kwargs):
        raise AssertionError(f"read {path} although the cache is valid")

    monkeypatch.setattr(folder_mod, "_decode_image", forbidden)
    monkeypatch.setattr(folder_mod, "_image_mode", forbidden)


# ----------------------------------------------------------------------------------------------- classes, shapes, pixels


def test_classes_count_and_names_come_from_the_folders(tmp_path):
    root = write_folder(tmp_path, ["zebra", "ant", "moth"], n_train=4, n_test=2, size=(13, 17))
    data = load_folder(root)
    assert isinstance(data, ImageData) and data.name == "folder"
    assert data.classes == ["ant", "moth", "zebra"] and data.num_classes == 3
    assert data.train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4 and data.test.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert data.channels == 3 and data.train.images.dtype == torch.uint8
    assert data.train.images.shape == (12, 3, 17, 13) and data.test.images.shape == (6, 3, 17, 13)  # [N, C, H, W]
    expected = torch.stack([pil_pixels(p, "RGB") for p in files_of(root, "train")])
    assert torch.equal(data.train.images, expected)  # PNG is lossless: exactly the written pixels


def test_seven_grey_classes_infer_one_channel_from_png_and_jpeg(tmp_path):
    classes = [f"digit{i}" for i in range(7)]
    root = write_folder(tmp_path, classes, n_train=2, n_test=1, size=(28, 28), grey=True)
    for name in classes:  # JPEG beside PNG in each class folder
        write_images(root / "train" / name, 1, size=(28, 28), grey=True, fmt="jpg", seed=7, first=2)
    data = load_folder(root)
    assert data.num_classes == 7 and data.channels == 1
    assert data.train.images.shape == (21, 1, 28, 28) and data.test.images.shape == (7, 1, 28, 28)
    expected = torch.stack([pil_pixels(p, "L") for p in files_of(root, "train")])
    assert torch.equal(data.train.images, expected)


def test_one_colour_training_image_makes_the_data_set_rgb(tmp_path):
    root = write_folder(tmp_path, ["a", "b"], n_train=3, n_test=1, size=(8, 8), grey=True)
    write_images(root / "train" / "b", 1, size=(8, 8), fmt="jpg", seed=3, first=3)  # RGB JPEG among grey PNGs
    data = load_folder(root)
    assert data.channels == 3 and data.train.images.shape == (7, 3, 8, 8)
    grey = data.train.images[0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])  # grey replicated into R, G, B


def test_channels_one_or_three_convert_every_image(tmp_path):
    rgb = write_folder(tmp_path / "rgb", ["a", "b"], n_train=2, n_test=1, size=(9, 7))
    as_grey = load_folder(rgb, channels=1, cache=False)
    assert as_grey.channels == 1 and as_grey.train.images.shape == (4, 1, 7, 9)
    assert torch.equal(as_grey.train.images, torch.stack([pil_pixels(p, "L") for p in files_of(rgb, "train")]))
    grey = write_folder(tmp_path / "grey", ["a", "b"], n_train=2, n_test=1, size=(9, 7), grey=True)
    as_rgb = load_folder(grey, channels=3, cache=False)
    assert as_rgb.channels == 3 and as_rgb.test.images.shape == (2, 3, 7, 9)
    assert torch.equal(as_rgb.test.images[:, 0], as_rgb.test.images[:, 2])  # grey replicated into R, G, B


def test_image_size_resizes_every_image_with_bilinear_filtering(tmp_path):
    root = tmp_path / "mixed"
    write_images(root / "train" / "a", 2, size=(28, 28))
    write_images(root / "train" / "b", 2, size=(13, 17), seed=1)
    write_images(root / "test" / "a", 1, size=(40, 30), seed=2)
    write_images(root / "test" / "b", 1, size=(16, 16), seed=3)
    data = load_folder(root, image_size=16)
    assert data.train.images.shape == (4, 3, 16, 16) and data.test.images.shape == (2, 3, 16, 16)
    expected = torch.stack([pil_pixels(p, "RGB", resize=16) for p in files_of(root, "train")])
    assert torch.equal(data.train.images, expected)
    assert torch.equal(data.test.images[1], pil_pixels(root / "test" / "b" / "000.png", "RGB"))  # 16x16: untouched


# ----------------------------------------------------------------------------------------------- mean / std and the cache


def test_measured_mean_std_match_numpy_and_come_back_from_the_cache(tmp_path, monkeypatch):
    root = write_folder(tmp_path, ["a", "b", "c"], n_train=5, n_test=2, size=(11, 6))
    data = load_folder(root, train_size=9, seed=2)
    pixels = data.train.images.numpy().astype(np.float64) / 255.0
    np.testing.assert_allclose(data.mean, pixels.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(data.std, pixels.std(axis=(0, 2, 3)), rtol=1e-12)  # population std
    full = load_folder(root)  # measured on the images actually used: another subset, other numbers
    assert full.mean != data.mean

    forbid_reading_images(monkeypatch)
    again = load_folder(root, train_size=9, seed=2)
    assert again.mean == data.mean and again.std == data.std and again.channels == 3
    assert torch.equal(again.train.images, data.train.images) and torch.equal(again.test.images, data.test.images)


def test_given_mean_and_std_are_used_as_is(tmp_path):
    root = write_folder(tmp_path, ["a", "b"], n_train=2, n_test=1, size=(5, 5))
    data = load_folder(root, mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 0.125])
    assert data.mean == [0.1, 0.2, 0.3] and data.std == [0.5, 0.25, 0.125]
    grey = load_folder(root, channels=1, mean=[0.5], cache=False)
    assert grey.mean == [0.5] and len(grey.std) == 1  # std not given: measured


@pytest.mark.parametrize("kwargs, message", [
    (dict(mean=[0.5]), r"dataset.mean has 1 values but the images have 3 channel"),
    (dict(std=[0.2, 0.2]), r"dataset.std has 2 values but the images have 3 channel"),
    (dict(mean=0.5), r"dataset.mean=0.5 must be a list of 3 numbers"),
    (dict(std="abc"), r"dataset.std='abc' must be a list of 3 numbers"),
    (dict(std=[0.2, 0.0, 0.2]), r"dataset.std=.* must be positive"),
])
def test_wrong_mean_or_std_is_named(tmp_path, kwargs, message):
    root = write_folder(tmp_path, ["a", "b"], n_train=2, n_test=1, size=(5, 5))
    with pytest.raises(ValueError, match=message):
        load_folder(root, **kwargs)


# ----------------------------------------------------------------------------------------------- subsets


def test_train_size_decodes_only_the_chosen_images(tmp_path, decodes):
    root = write_folder(tmp_path, [f"c{i}" for i in range(7)], n_train=6, n_test=3, size=(6, 6))
    data = load_folder(root, train_size=14, test_size=7, cache=False)
    assert len(data.train) == 14 and len(data.test) == 7
    assert len(decodes) == 21  # not the 63 images of the folder
    train_files = {str(p) for p in files_of(root, "train")}
    assert len(set(decodes) & train_files) == 14
    assert torch.bincount(data.train.labels).tolist() == [2] * 7 and torch.bincount(data.test.labels).tolist() == [1] * 7


def test_subsets_equal_decoding_everything_then_subsetting(tmp_path):
    root = write_folder(tmp_path, [f"c{i}" for i in range(7)], n_train=6, n_test=3, size=(6, 6))
    everything = load_folder(root, cache=False)
    for train_size, test_size, seed in ((14, 7, 0), (30, 10, 3), (1, 1, 5)):
        part = load_folder(root, train_size=train_size, test_size=test_size, seed=seed, cache=False)
        expected_train = subset(everything.train, train_size, seed)
        expected_test = cap_test_split(everything.test, test_size)
        assert torch.equal(part.train.images, expected_train.images) and torch.equal(part.train.labels, expected_train.labels)
        assert torch.equal(part.test.images, expected_test.images) and torch.equal(part.test.labels, expected_test.labels)


def test_cifar_image_folder_subset_decodes_only_its_images_and_equals_the_old_path(tmp_path, decodes):
    root = write_folder(tmp_path, CIFAR10_NAMES, n_train=4, n_test=2, size=(32, 32))
    part = load_cifar("cifar10", root, download=False, train_size=20, test_size=10, seed=1)
    assert len(decodes) == 30  # of 60 files
    everything = load_cifar("cifar10", root, download=False)  # the old path: decode all, then subset
    expected_train, expected_test = subset(everything.train, 20, 1), cap_test_split(everything.test, 10)
    assert torch.equal(part.train.images, expected_train.images) and torch.equal(part.train.labels, expected_train.labels)
    assert torch.equal(part.test.images, expected_test.images) and torch.equal(part.test.labels, expected_test.labels)
    assert part.channels == 3 and part.mean is None


def test_subset_and_full_caches_are_separate_files(tmp_path, monkeypatch):
    root = write_folder(tmp_path, CIFAR10_NAMES, n_train=2, n_test=1, size=(32, 32))
    full = load_cifar("cifar10", root, download=False)
    part = load_cifar("cifar10", root, download=False, train_size=10)
    other_seed = load_cifar("cifar10", root, download=False, train_size=10, seed=1)
    folder = load_folder(root, train_size=10)
    full_cache = cache_path(root, "cifar10", "folder")
    names = sorted(p.name for p in full_cache.parent.glob(f"*-{root_key(root)}-*.pt"))
    assert len(names) == 4 and full_cache.name in names  # the full set keeps its own name
    assert not list(full_cache.parent.glob("*.tmp")) and not (root / ".swalab_cache").exists()

    forbid_reading_images(monkeypatch)  # every load below is served by its own file, never another's
    assert len(load_cifar("cifar10", root, download=False).train) == 20
    assert torch.equal(load_cifar("cifar10", root, download=False, train_size=10).train.images, part.train.images)
    assert torch.equal(load_cifar("cifar10", root, download=False, train_size=10, seed=1).train.images,
                       other_seed.train.images)
    assert torch.equal(load_folder(root, train_size=10).train.images, folder.train.images)
    assert len(full.train) == 20 and not torch.equal(part.train.images, other_seed.train.images)


def test_test_size_is_the_same_for_every_seed(tmp_path):
    root = write_folder(tmp_path, ["a", "b", "c"], n_train=4, n_test=4, size=(5, 5))
    runs = [load_folder(root, train_size=6, test_size=6, seed=seed, cache=False) for seed in (0, 1, 7)]
    for other in runs[1:]:
        assert torch.equal(other.test.images, runs[0].test.images) and torch.equal(other.test.labels, runs[0].test.labels)
    assert not all(torch.equal(r.train.images, runs[0].train.images) for r in runs[1:])  # train follows the seed
    assert torch.bincount(runs[0].test.labels).tolist() == [2, 2, 2]


@pytest.mark.parametrize("key", ["train_size", "test_size"])
@pytest.mark.parametrize("value, message", [
    (0, r"=0 is out of range: the \w+ split has \d+ items"),
    (99, r"=99 is out of range"),
    (2.5, r" must be an integer or null, got 2.5"),
    ("abc", r" must be an integer or null, got 'abc'"),
    (True, r" must be an integer or null, got True"),
])
def test_bad_train_or_test_size_names_the_key(tmp_path, key, value, message):
    root = write_folder(tmp_path, ["a", "b"], n_train=3, n_test=3, size=(4, 4))
    with pytest.raises(ValueError, match=re.escape(f"dataset.{key}") + message):
        load_folder(root, **{key: value})
    with pytest.raises(ValueError, match=re.escape(f"dataset.{key}") + message):
        load_cifar("cifar10", write_folder(tmp_path / "cifar", CIFAR10_NAMES, 3, 3, size=(32, 32)), download=False,
                   **{key: value})


# ----------------------------------------------------------------------------------------------- errors


def test_mixed_sizes_without_image_size_name_both_files(tmp_path):
    root = tmp_path.resolve()
    write_images(root / "train" / "a", 2, size=(13, 17))
    write_images(root / "train" / "b", 1, size=(28, 28))
    write_images(root / "test" / "a", 1, size=(13, 17))
    write_images(root / "test" / "b", 1, size=(13, 17))
    with pytest.raises(ValueError) as info:
        load_folder(root)
    msg = str(info.value)
    assert f"{root / 'train' / 'b' / '000.png'} is 28x28" in msg and f"{root / 'train' / 'a' / '000.png'} is 13x17" in msg
    assert "dataset.image_size" in msg


def test_a_test_image_of_another_size_is_named(tmp_path):
    root = write_folder(tmp_path.resolve(), ["a", "b"], n_train=2, n_test=1, size=(8, 8))
    write_images(root / "test" / "b", 1, size=(9, 8), first=1)
    with pytest.raises(ValueError, match=r"test/b/001\.png is 9x8 \(WxH\) but .*train/a/000\.png is 8x8"):
        load_folder(root)


def test_missing_split_empty_class_and_different_classes_are_named(tmp_path):
    only_train = tmp_path / "only_train"
    write_images(only_train / "train" / "a", 1)
    with pytest.raises(FileNotFoundError, match=r"only_train has train/ but no test/"):
        load_folder(only_train)
    empty = write_folder(tmp_path / "empty", ["a", "b"], n_train=1, n_test=1)
    for f in (empty / "test" / "b").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match=r"class folder .*empty/test/b is empty"):
        load_folder(empty)
    differ = write_folder(tmp_path / "differ", ["a", "b"], n_train=1, n_test=1)
    (differ / "test" / "b").rename(differ / "test" / "c")
    with pytest.raises(ValueError, match=r"different class folders: only in train/: \['b'\]; only in test/: \['c'\]"):
        load_folder(differ)


@pytest.mark.parametrize("channels", [2, 4, 0, True, "3"])
def test_channels_other_than_1_3_or_null_are_refused(tmp_path, channels):
    root = write_folder(tmp_path, ["a", "b"], n_train=1, n_test=1)
    with pytest.raises(ValueError, match=re.escape(f"dataset.channels={channels!r} is not supported: use 1")):
        load_folder(root, channels=channels)


@pytest.mark.parametrize("image_size", [0, -8, 2.5, "32", True])
def test_bad_image_size_is_named(tmp_path, image_size):
    root = write_folder(tmp_path, ["a", "b"], n_train=1, n_test=1)
    with pytest.raises(ValueError, match="dataset.image_size=.* must be a positive integer"):
        load_folder(root, image_size=image_size)


@pytest.mark.parametrize("channels", [None, 3])  # None reads the headers first: the same message
def test_unreadable_image_is_named(tmp_path, channels):
    root = write_folder(tmp_path, ["a", "b"], n_train=2, n_test=1)
    (root / "train" / "b" / "001.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(ValueError, match=r"cannot decode image .*train/b/001\.png"):
        load_folder(root, channels=channels)


def test_unset_or_missing_root_says_to_set_dataset_root(tmp_path):
    for unset in (None, "", "???"):
        with pytest.raises(ValueError, match=re.escape("dataset.root is not set: set dataset.root=DIR")):
            load_folder(unset)
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist .*set dataset.root=DIR"):
        load_folder(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()  # nothing created


# ----------------------------------------------------------------------------------------------- config


def test_folder_config_builds_the_data_set(make_cfg, tmp_path):
    root = write_folder(tmp_path / "data", ["a", "b", "c"], n_train=4, n_test=2, size=(12, 12), grey=True)
    cfg = make_cfg("dataset=folder", f"dataset.root={root}", "dataset.train_size=6", "dataset.test_size=3",
                   f"run.cache_dir={tmp_path / 'cache'}", "dataset.image_size=8", "dataset.mean=[0.5]", "seed=3")
    data = instantiate(cfg.dataset.source)
    assert data.name == "data" and data.num_classes == 3  # named after its folder
    assert data.channels == 1 and data.mean == [0.5]
    assert data.train.images.shape == (6, 1, 8, 8) and len(data.test) == 3
    assert len(list((tmp_path / "cache").glob(f"data-{root_key(root)}-folder-*-v{CACHE_FORMAT_VERSION}.pt"))) == 1


def test_folder_config_requires_a_root(make_cfg):
    cfg = make_cfg("dataset=folder")
    assert OmegaConf.is_missing(cfg.dataset, "root") and cfg.dataset.num_classes is None and cfg.dataset.pad is None
    with pytest.raises(Exception, match=r"Missing mandatory value: dataset\.(root|source\.name)"):
        instantiate(cfg.dataset.source)  # never reaches load_folder with a placeholder root
    with pytest.raises(ConfigError, match=r"dataset\.root is required: set dataset\.root="):
        validate(cfg)  # what a run says before anything else


def test_digits_config_refuses_a_root(make_cfg):
    with pytest.raises(Exception, match=r"Could not override 'dataset.root'"):
        make_cfg("dataset=digits", "dataset.root=/somewhere")


# ----------------------------------------------------------------------------------------------- real data


def test_real_cifar10_jpeg_subset_decodes_only_what_it_uses(cifar10_jpg, tmp_path, decodes):
    data = load_folder(cifar10_jpg, train_size=200, test_size=100, cache_dir=tmp_path)
    assert len(decodes) == 300  # of 60,000 files
    assert data.classes == CIFAR10_NAMES and data.num_classes == 10 and data.channels == 3
    assert data.train.images.shape == (200, 3, 32, 32) and data.test.images.shape == (100, 3, 32, 32)
    assert torch.bincount(data.train.labels).tolist() == [20] * 10 and torch.bincount(data.test.labels).tolist() == [10] * 10
    assert all(0.3 < m < 0.65 for m in data.mean) and all(0.15 < s < 0.35 for s in data.std)  # real photos
    cifar = load_cifar("cifar10", cifar10_jpg, download=False, train_size=200, test_size=100, cache_dir=tmp_path)
    assert torch.equal(cifar.train.images, data.train.images) and torch.equal(cifar.test.labels, data.test.labels)


def test_a_folder_is_the_images_it_holds_wherever_it_lies_and_however_its_path_is_typed(make_cfg, tmp_path,
                                                                                        monkeypatch):
    """A data set's identity is its files' fingerprint, not its path: the same images in two places, or one folder
    typed relative or absolute, are one data set; one image rewritten (even to the same size and modification
    time) or added makes another."""
    def identity(root):
        return prepare(make_cfg("dataset=folder", f"dataset.root={root}", "trainer.epochs=2"),
                       run_dir=tmp_path / "nowhere").identity

    for place in ("one", "two"):
        write_folder(tmp_path / place / "ds" / "good", ["a", "b"], n_train=2, n_test=1, size=(8, 8), grey=True)
    monkeypatch.chdir(tmp_path / "one")
    relative_here, absolute = identity("ds/good"), identity(tmp_path / "one" / "ds" / "good")
    monkeypatch.chdir(tmp_path / "two")
    relative_there = identity("ds/good")
    assert relative_here == absolute == relative_there and "dataset.root" not in absolute
    image = tmp_path / "two" / "ds" / "good" / "train" / "a" / "000.png"
    stat = image.stat()
    Image.fromarray(np.full((8, 8), 99, np.uint8)).save(image)  # rewritten in place ...
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))     # ... its size and mtime set back
    rewritten = identity("ds/good")
    assert rewritten["data.fingerprint"] != relative_there["data.fingerprint"]
    assert not (tmp_path / "nowhere").exists()


# ----------------------------------------------------------------------------------------------- what a run read


def folder_run_cfg(make_cfg, root, *extra):
    return make_cfg("dataset=folder", f"dataset.root={root}", "method=sgd", "trainer.epochs=2", "trainer.batch_size=4",
                    "model.arch.depth=8", *extra)


def test_a_run_refuses_to_resume_or_skip_on_a_data_set_that_changed_naming_what_did(make_cfg, tmp_path):
    from swalab.train import train

    root = write_folder(tmp_path / "ds", ["cat", "dog"], n_train=4, n_test=2, size=(8, 8), grey=True)
    run = tmp_path / "run"
    train(folder_run_cfg(make_cfg, root), run_dir=run)
    facts = json.loads((run / "data.json").read_text())  # what the run trained on, in its own words
    assert facts["classes"] == ["cat", "dog"] and facts["channels"] == 1 and facts["image_size"] == [8, 8]
    assert facts["train_images"] == 8 and facts["test_images"] == 4 and len(facts["measured_mean"]) == 1
    assert facts["record"]["files"]["train/cat"][0] == 4
    write_images(root / "train" / "cat", 3, size=(8, 8), grey=True, first=50)   # images added ...
    (root / "test" / "dog" / "000.png").unlink()                                # ... and one removed
    with pytest.raises(ConfigError, match=r"the data set changed since it was made \(test/dog: 2 files then, 1 now; "
                                          r"train/cat: 4 files then, 7 now\)"):
        train(folder_run_cfg(make_cfg, root), run_dir=run)


def test_a_run_of_an_earlier_version_without_a_data_fingerprint_still_resumes(make_cfg, tmp_path):
    from swalab.train import train

    root = write_folder(tmp_path / "ds", ["cat", "dog"], n_train=4, n_test=2, size=(8, 8), grey=True)
    run = tmp_path / "run"
    first = train(folder_run_cfg(make_cfg, root), run_dir=run)
    stored = json.loads((run / "identity.json").read_text())
    old = {k: v for k, v in stored["identity"].items() if k != "data.fingerprint"}
    old["dataset.root"], old["dataset.root_is_data"] = str(root), True  # what an earlier swalab recorded
    (run / "identity.json").write_text(json.dumps({**stored, "identity": old}))
    (run / "metrics.json").unlink()                                      # and it was interrupted after its last epoch
    assert train(folder_run_cfg(make_cfg, root), run_dir=run) == first


def test_16_bit_grey_images_are_read_at_their_full_depth(tmp_path):
    levels = (np.arange(64).reshape(8, 8) * 1000 + 7).astype(np.uint16)  # 7 .. 63007 of 65535: not one is 8-bit
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(levels).save(tmp_path / split / "a" / "0.png")
        assert Image.open(tmp_path / split / "a" / "0.png").mode == "I;16"
    data = load_folder(tmp_path)
    assert data.channels == 1 and data.train.images.dtype == torch.uint16  # PIL's convert would leave 2 levels
    assert torch.equal(data.train.images[0, 0], torch.from_numpy(levels.astype(np.int32)).to(torch.uint16))
    assert data.mean[0] == pytest.approx(levels.astype(np.float64).mean() / 65535)


def test_8_bit_images_beside_16_bit_ones_are_scaled_to_the_same_full_scale(tmp_path):
    deep = np.full((4, 4), 65535, dtype=np.uint16)
    shallow = np.full((4, 4), 255, dtype=np.uint8)   # white in 8 bits is white in 16 bits: 255 * 257 = 65535
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(shallow).save(tmp_path / split / "a" / "0.png")   # the first image is 8-bit
        Image.fromarray(deep).save(tmp_path / split / "a" / "1.png")
    images = load_folder(tmp_path, std=[0.3]).train.images  # (one grey level: its std cannot be measured)
    assert images.dtype == torch.uint16 and bool((images.to(torch.int32) == 65535).all())


def test_a_16_bit_image_resized_keeps_16_bit_values(tmp_path):
    ramp = np.tile(np.linspace(0, 65535, 16).round().astype(np.uint16), (16, 1))
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(ramp).save(tmp_path / split / "a" / "0.png")
    images = load_folder(tmp_path, image_size=8).train.images.to(torch.int32)
    assert images.shape == (1, 1, 8, 8) and images.unique().numel() == 8 and int(images.max()) > 60000


def test_16_bit_pixels_reach_the_model_as_their_8_bit_equivalents_would(tmp_path):
    from swalab.data import DataSplit
    from swalab.data.loader import ResidentLoader

    pixels = torch.randint(0, 256, (6, 1, 4, 4), dtype=torch.uint8)
    labels = torch.zeros(6, dtype=torch.int64)
    as_8 = ResidentLoader(DataSplit(pixels, labels), 6, "cpu", [0.5], [0.25], train=False)
    as_16 = ResidentLoader(DataSplit((pixels.to(torch.int32) * 257).to(torch.uint16), labels), 6, "cpu", [0.5],
                           [0.25], train=False)
    (x8, _), (x16, _) = next(iter(as_8)), next(iter(as_16))
    assert torch.allclose(x8, x16, atol=1e-5) and float(x8.max()) <= (1 - 0.5) / 0.25 + 1e-5
    augmented = [ResidentLoader(DataSplit(images, labels), 6, "cpu", [0.5], [0.25], train=True, pad=2, seed=3)
                 for images in (pixels, (pixels.to(torch.int32) * 257).to(torch.uint16))]
    (a8, _), (a16, _) = (next(iter(loader)) for loader in augmented)
    assert torch.allclose(a8, a16, atol=1e-5)  # the same crops and flips, the same padding value


def test_a_run_on_16_bit_images_trains_and_records_their_depth(make_cfg, tmp_path):
    from swalab.train import train

    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        for label in ("a", "b"):
            (tmp_path / "ds" / split / label).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 65536, (8, 8)).astype(np.uint16)).save(
                    tmp_path / "ds" / split / label / f"{i}.png")
    metrics = train(folder_run_cfg(make_cfg, tmp_path / "ds"), run_dir=tmp_path / "run")
    facts = json.loads((tmp_path / "run" / "data.json").read_text())
    assert facts["bits_per_pixel"] == 16 and facts["channels"] == 1
    assert 0.4 < facts["measured_mean"][0] < 0.6 and metrics["sgd"]["nll"] > 0


def test_the_decode_cache_lives_in_the_users_cache_directory_and_the_run_names_it(make_cfg, tmp_path, monkeypatch,
                                                                                   caplog):
    from swalab.train import train

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = write_folder(tmp_path / "ds", ["cat", "dog"], n_train=4, n_test=2, size=(8, 8), grey=True)
    root.chmod(0o555)  # a read-only data folder, as shared data sets are
    try:
        with caplog.at_level("INFO", logger="swalab"):
            train(folder_run_cfg(make_cfg, root), run_dir=tmp_path / "run")
    finally:
        root.chmod(0o755)
    cached = list((tmp_path / "xdg" / "swalab").glob(f"ds-{root_key(root)}-folder-*-v{CACHE_FORMAT_VERSION}.pt"))
    assert len(cached) == 1 and not (root / ".swalab_cache").exists()
    assert f"decoded images cached in {cached[0]}" in caplog.text
    first = (tmp_path / "run" / "run.log").read_text().splitlines()[0]
    assert f"decoded images cached in {cached[0]}" in first  # the run's first line names the cache it created


def test_a_32_bit_integer_image_of_8_bit_values_is_read_as_8_bit(tmp_path):
    values = (np.arange(64).reshape(8, 8) * 4).astype(np.int32)  # 0 .. 252 in a mode-I image
    for split in ("train", "test"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.fromarray(values, mode="I").save(tmp_path / split / "a" / "0.tif")
    data = load_folder(tmp_path)
    assert torch.equal(data.train.images[0, 0], torch.from_numpy(values.astype(np.uint8)))  # not squashed to ~0


def test_the_plan_hands_its_record_of_the_files_to_the_loader(make_cfg, tmp_path, monkeypatch):
    import swalab.data.fingerprint as fingerprint
    from swalab.train import train

    root = write_folder(tmp_path / "ds", ["cat", "dog"], n_train=4, n_test=2, size=(8, 8), grey=True)
    made = []
    real = fingerprint._class_folders
    monkeypatch.setattr(fingerprint, "_class_folders", lambda d: made.append(d) or real(d))
    train(folder_run_cfg(make_cfg, root), run_dir=tmp_path / "run")
    assert len(made) == 2  # train/ and test/ listed once, by the plan: the loader reads the same record
