"""Tests for swalab.data: CIFAR pickles and image folders, the decode cache, digits, ResidentLoader.

Every file these tests read is written by them into tmp_path in the real formats; nothing is downloaded.
One test reads the JPEG copy of CIFAR-10 when it is present and is skipped otherwise.
"""

from __future__ import annotations

import pickle
import urllib.error
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import swalab.data.cache as cache_mod
import swalab.data.folder as folder_mod
from swalab.data.cache import CACHE_FORMAT_VERSION, cache_path
from swalab.data import (
    DataSplit,
    ImageData,
    ResidentLoader,
    cap_test_split,
    channel_stats,
    load_cifar,
    load_digits,
    random_crop_flip,
    read_image_folder,
    subset,
)

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ----------------------------------------------------------------------------------------------- writers


def _dump(path: Path, obj: dict, bytes_keys: bool) -> None:
    if bytes_keys:
        obj = {k.encode(): v for k, v in obj.items()}
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10_pickles(root: Path, per_batch: int = 4, bytes_keys: bool = True, seed: int = 0) -> dict:
    """Tiny files in the layout and format of torchvision's cifar-10-batches-py."""
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    written = {}
    for fname in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        _dump(d / fname, {"batch_label": fname, "data": data, "labels": labels, "filenames": ["x.png"] * per_batch}, bytes_keys)
        written[fname] = (data, labels)
    _dump(d / "batches.meta", {"label_names": CIFAR10_NAMES, "num_cases_per_batch": per_batch, "num_vis": 3072}, bytes_keys)
    return written


def write_cifar100_pickles(root: Path, n: int = 6, bytes_keys: bool = False) -> dict:
    rng = np.random.default_rng(1)
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    written = {}
    for fname in ("train", "test"):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        coarse = [f // 5 for f in fine]
        _dump(d / fname, {"data": data, "fine_labels": fine, "coarse_labels": coarse, "filenames": ["x"] * n}, bytes_keys)
        written[fname] = (data, fine)
    fine_names = [f"class_{i:03d}" for i in range(100)]
    _dump(d / "meta", {"fine_label_names": fine_names, "coarse_label_names": [f"super_{i}" for i in range(20)]}, bytes_keys)
    return written


def write_png_folder(root: Path, num_classes: int = 10, n_train: int = 2, n_test: int = 1, size: int = 32) -> dict:
    """root/{train,test}/<class>/NNNN.png with random pixels (PNG is lossless, so pixels are exact)."""
    rng = np.random.default_rng(2)
    names = [f"c{i:02d}" for i in range(num_classes)]
    written = {}
    for split, n in (("train", n_train), ("test", n_test)):
        arrays = []
        for name in names:
            (root / split / name).mkdir(parents=True)
            for j in range(n):
                arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / name / f"{j:04d}.png")
                arrays.append(arr)
        written[split] = np.stack(arrays)
    written["classes"] = names
    return written


# ----------------------------------------------------------------------------------------------- CIFAR pickles


def test_cifar10_pickles_shapes_labels_and_pixel_order(tmp_path):
    written = write_cifar10_pickles(tmp_path, per_batch=4, bytes_keys=True)
    data = load_cifar("cifar10", tmp_path, download=False)
    assert data.name == "cifar10" and data.num_classes == 10 and data.classes == CIFAR10_NAMES
    assert data.train.images.shape == (20, 3, 32, 32) and data.train.images.dtype == torch.uint8
    assert data.test.images.shape == (4, 3, 32, 32)
    expected_train_labels = sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert data.train.labels.tolist() == expected_train_labels
    assert data.test.labels.tolist() == written["test_batch"][1]
    # Row layout: 1024 red values, 1024 green, 1024 blue, each plane row-major.
    row = written["data_batch_2"][0][1]  # second image of the second batch = train image 5
    c, y, x = 1, 2, 3
    assert data.train.images[5, c, y, x].item() == row[c * 1024 + y * 32 + x]
    assert torch.equal(data.train.images[5], torch.from_numpy(row).reshape(3, 32, 32))


def test_cifar100_pickles_use_fine_labels(tmp_path):
    written = write_cifar100_pickles(tmp_path, bytes_keys=False)
    data = load_cifar("cifar100", tmp_path, download=False)
    assert data.num_classes == 100 and len(data.classes) == 100 and data.classes[7] == "class_007"
    assert data.train.images.shape == (6, 3, 32, 32)
    assert data.train.labels.tolist() == written["train"][1]
    assert data.test.labels.tolist() == written["test"][1]
    assert torch.equal(data.test.images.reshape(6, -1), torch.from_numpy(written["test"][0]))


def test_root_may_be_the_pickle_folder_itself(tmp_path):
    write_cifar10_pickles(tmp_path)
    data = load_cifar("cifar10", tmp_path / "cifar-10-batches-py", download=False)
    assert len(data.train) == 20


def test_pickle_labels_out_of_range_name_the_file(tmp_path):
    write_cifar10_pickles(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    _dump(bad, {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}, bytes_keys=True)
    with pytest.raises(ValueError, match="data_batch_3.*labels range over \\[0, 10\\]"):
        load_cifar("cifar10", tmp_path, download=False)


def test_pickle_missing_or_corrupt_file_is_named(tmp_path):
    write_cifar10_pickles(tmp_path)
    batches = tmp_path / "cifar-10-batches-py"
    (batches / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_4"):
        load_cifar("cifar10", tmp_path, download=False)
    (batches / "data_batch_4").write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match="data_batch_4"):
        load_cifar("cifar10", tmp_path, download=False)


def test_unknown_name_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="cifar10"):
        load_cifar("cifar11", tmp_path, download=False)


# ----------------------------------------------------------------------------------------------- missing data / download


def test_missing_data_without_download_explains_how_to_get_it(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        load_cifar("cifar10", root, download=False)
    msg = str(info.value)
    for needle in ("dataset.root", str(root.resolve()), "cifar-10-batches-py", "data_batch_1", "test_batch",
                   "batches.meta", "train/<class>", "test/<class>", "run.download=true", "copy"):
        assert needle in msg, f"{needle!r} missing from: {msg}"


def test_failed_download_gives_a_clear_error(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR100", offline)
    with pytest.raises(RuntimeError) as info:
        load_cifar("cifar100", tmp_path, download=True)
    msg = str(info.value)
    assert "downloading it failed" in msg and "name resolution" in msg
    assert "dataset.root" in msg and "cifar-100-python" in msg and "run.download=true" in msg


def test_failed_download_removes_only_the_folders_it_created(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(root, train, download):
        (Path(root) / "cifar-10-python.tar.gz").write_bytes(b"partial")  # what an interrupted download leaves
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(RuntimeError, match="downloading it failed"):
        load_cifar("cifar10", tmp_path / "data" / "cifar10", download=True)
    assert list(tmp_path.iterdir()) == []  # data/ and data/cifar10/ were created by the attempt: both gone

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(RuntimeError, match="downloading it failed"):
        load_cifar("cifar10", mine, download=True)
    assert (mine / "notes.txt").read_text() == "keep me"  # a root that existed before is left in place


def test_download_fills_root_then_loads(tmp_path, monkeypatch):
    import torchvision.datasets

    calls = []

    def fake_cifar10(root, train, download):
        calls.append((root, train, download))
        write_cifar10_pickles(Path(root))

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fake_cifar10)
    data = load_cifar("cifar10", tmp_path / "new", download=True)
    assert calls == [(str((tmp_path / "new").resolve()), True, True)]
    assert len(data.train) == 20 and len(data.test) == 4


# ----------------------------------------------------------------------------------------------- image folder + cache


def test_image_folder_loads_exact_pixels_and_caches(tmp_path, monkeypatch):
    written = write_png_folder(tmp_path)
    data = load_cifar("cifar10", tmp_path, download=False)
    assert data.classes == written["classes"]
    assert data.train.images.shape == (20, 3, 32, 32) and data.test.images.shape == (10, 3, 32, 32)
    assert data.train.labels.tolist() == [i // 2 for i in range(20)]
    assert torch.equal(data.train.images, torch.from_numpy(written["train"]).permute(0, 3, 1, 2))
    assert torch.equal(data.test.images, torch.from_numpy(written["test"]).permute(0, 3, 1, 2))

    path = cache_path(tmp_path, "cifar10", "folder")
    assert path.is_file() and not list(path.parent.glob("*.tmp"))
    saved = torch.load(path, weights_only=True)
    assert saved["format_version"] == CACHE_FORMAT_VERSION and saved["classes"] == written["classes"]
    assert {"source", "train_images", "train_labels", "test_images", "test_labels"} <= set(saved)

    def must_not_decode(p):
        raise AssertionError(f"decoded {p} although the cache is valid")

    monkeypatch.setattr(folder_mod, "_decode_image", must_not_decode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load_cifar("cifar10", tmp_path, download=False)
    assert torch.equal(again.train.images, data.train.images) and torch.equal(again.test.labels, data.test.labels)
    assert again.classes == data.classes


def test_cache_with_other_format_version_is_rebuilt(tmp_path):
    write_png_folder(tmp_path)
    first = load_cifar("cifar10", tmp_path, download=False)
    path = cache_path(tmp_path, "cifar10", "folder")
    saved = torch.load(path, weights_only=True)
    saved["format_version"] = 0
    saved["train_images"] = torch.zeros_like(saved["train_images"])  # would show if the stale cache were used
    torch.save(saved, path)
    with pytest.warns(UserWarning, match="format_version 0"):
        rebuilt = load_cifar("cifar10", tmp_path, download=False)
    assert torch.equal(rebuilt.train.images, first.train.images)
    assert torch.load(path, weights_only=True)["format_version"] == CACHE_FORMAT_VERSION


def test_unreadable_or_stale_cache_is_rebuilt(tmp_path):
    write_png_folder(tmp_path)
    load_cifar("cifar10", tmp_path, download=False)
    path = cache_path(tmp_path, "cifar10", "folder")
    path.write_bytes(b"\x00garbage")
    with pytest.warns(UserWarning, match="could not be loaded"):
        load_cifar("cifar10", tmp_path, download=False)
    # An image added after caching must show up: the cache is keyed by the folder's files.
    Image.fromarray(np.full((32, 32, 3), 7, np.uint8)).save(tmp_path / "train" / "c03" / "0099.png")
    with pytest.warns(UserWarning, match="other files"):
        data = load_cifar("cifar10", tmp_path, download=False)
    assert len(data.train) == 21 and int((data.train.images == 7).all(dim=(1, 2, 3)).sum()) == 1


def test_unwritable_cache_location_warns_and_still_loads(tmp_path):
    write_png_folder(tmp_path)
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    with pytest.warns(UserWarning, match="cannot write decode cache"):
        data = load_cifar("cifar10", tmp_path, download=False, cache_dir=tmp_path / "cache")
    assert len(data.train) == 20


def test_failed_cache_write_keeps_the_old_cache_and_leaves_no_temp_file(tmp_path, monkeypatch):
    write_png_folder(tmp_path)
    load_cifar("cifar10", tmp_path, download=False)
    path = cache_path(tmp_path, "cifar10", "folder")
    before = path.read_bytes()

    def disk_full(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.torch, "save", disk_full)
    with pytest.warns(UserWarning, match="No space left"):
        cache_mod.save_cache(path, {"source": {}})
    assert path.read_bytes() == before and not list(path.parent.glob("*.tmp"))


def test_cache_false_writes_nothing(tmp_path):
    write_png_folder(tmp_path)
    load_cifar("cifar10", tmp_path, download=False, cache=False)
    assert not cache_path(tmp_path, "cifar10", "folder").exists()


def test_corrupt_image_is_named(tmp_path):
    write_png_folder(tmp_path)
    bad = tmp_path / "test" / "c05" / "0000.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    with pytest.raises(ValueError, match="cannot decode image .*c05.*0000.png"):
        load_cifar("cifar10", tmp_path, download=False)


def test_wrong_image_size_is_named(tmp_path):
    write_png_folder(tmp_path)
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(tmp_path / "train" / "c01" / "0001.png")
    with pytest.raises(ValueError, match="c01.*0001.png is 28x28"):
        load_cifar("cifar10", tmp_path, download=False)


def test_empty_class_folder_is_named(tmp_path):
    write_png_folder(tmp_path)
    for f in (tmp_path / "train" / "c04").iterdir():
        f.unlink()
    (tmp_path / "train" / "c04" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="class folder .*c04 is empty"):
        load_cifar("cifar10", tmp_path, download=False)


def test_missing_test_split_is_named(tmp_path):
    write_png_folder(tmp_path)
    for f in (tmp_path / "test").rglob("*.png"):
        f.unlink()
    for d in (tmp_path / "test").iterdir():
        d.rmdir()
    (tmp_path / "test").rmdir()
    with pytest.raises(FileNotFoundError, match="has train/ but no test/"):
        load_cifar("cifar10", tmp_path, download=False)


def test_class_count_must_match_the_dataset(tmp_path):
    write_png_folder(tmp_path, num_classes=7, n_train=1, n_test=1)
    with pytest.raises(ValueError, match="7 class folders .* CIFAR-10 has 10"):
        load_cifar("cifar10", tmp_path, download=False)


def test_read_image_folder_max_per_class(tmp_path):
    written = write_png_folder(tmp_path, num_classes=3, n_train=4, n_test=2, size=8)
    train, test, classes = read_image_folder(tmp_path, max_per_class=2)
    assert classes == written["classes"] and train.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(train.images[2], torch.from_numpy(written["train"][4]).permute(2, 0, 1))
    assert len(test) == 6


# ----------------------------------------------------------------------------------------------- subsets and digits


def _indexed_split(n: int, num_classes: int) -> DataSplit:
    """Images that encode their own index in two bytes, so a subset tells which items it kept."""
    idx = torch.arange(n)
    images = torch.stack([idx // 256, idx % 256], dim=1).to(torch.uint8).view(n, 1, 1, 2)
    return DataSplit(images=images, labels=idx % num_classes)


def _ids(split: DataSplit) -> list[int]:
    return (split.images[:, 0, 0, 0].long() * 256 + split.images[:, 0, 0, 1].long()).tolist()


def _kept(split: DataSplit) -> set[int]:
    return set(_ids(split))


def test_train_size_subset_is_stratified_nested_and_checked(tmp_path):
    split = _indexed_split(1000, 10)
    small, big = subset(split, 100, seed=3), subset(split, 300, seed=3)
    assert torch.bincount(small.labels, minlength=10).tolist() == [10] * 10
    assert len(big) == 300 and _kept(small) < _kept(big)  # growing train_size only adds items
    assert _ids(small) == sorted(_ids(small))  # kept items stay in their original order
    assert _kept(subset(split, 100, seed=3)) == _kept(small) and _kept(subset(split, 100, seed=4)) != _kept(small)
    assert subset(split, None, seed=0) is split
    with pytest.raises(ValueError, match="dataset.train_size=1001"):
        subset(split, 1001, seed=0)
    write_cifar10_pickles(tmp_path, per_batch=20)
    assert len(load_cifar("cifar10", tmp_path, download=False, train_size=30).train) == 30


def test_test_size_is_one_fixed_subset_for_every_seed(tmp_path):
    a, b = load_digits(seed=0, test_size=100), load_digits(seed=9, train_size=300, test_size=100)
    assert len(a.test) == 100 and torch.bincount(a.test.labels, minlength=10).min() >= 9  # stratified
    assert torch.equal(a.test.images, b.test.images) and torch.equal(a.test.labels, b.test.labels)
    assert torch.equal(a.test.images, cap_test_split(load_digits().test, 100).images)
    write_cifar10_pickles(tmp_path, per_batch=20)
    one, other = (load_cifar("cifar10", tmp_path, download=False, test_size=8, seed=s) for s in (0, 4))
    assert len(one.test) == 8 and torch.equal(one.test.images, other.test.images)
    for bad in (0, 361, 2.5, "abc", True):
        with pytest.raises(ValueError, match="dataset.test_size"):
            load_digits(test_size=bad)
    with pytest.raises(ValueError, match="dataset.train_size must be an integer or null, got 'abc'"):
        load_digits(train_size="abc")


def test_image_data_knows_its_channels():
    split = DataSplit(images=torch.zeros(2, 1, 4, 4, dtype=torch.uint8), labels=torch.zeros(2, dtype=torch.int64))
    data = ImageData(name="x", train=split, test=split, num_classes=1, classes=["a"])
    assert data.channels == 1 and data.mean is None and data.std is None
    assert load_digits().channels == 1
    with pytest.raises(ValueError, match="channels=3 but its images have 1"):
        ImageData(name="x", train=split, test=split, num_classes=1, classes=["a"], channels=3)
    with pytest.raises(ValueError, match="mean has 3 values for 1 channels"):
        ImageData(name="x", train=split, test=split, num_classes=1, classes=["a"], mean=[0.5, 0.5, 0.5])


def test_channel_stats_match_numpy():
    images = torch.randint(0, 256, (50, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = channel_stats(images, chunk=16)  # several chunks
    x = images.numpy().astype(np.float64) / 255
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(std, x.std(axis=(0, 2, 3)), rtol=1e-12)


def test_digits_shapes_and_fixed_test_split():
    a = load_digits(seed=0)
    b = load_digits(seed=5, train_size=200)
    assert a.name == "digits" and a.num_classes == 10 and a.classes == [str(i) for i in range(10)]
    assert a.train.images.shape == (1437, 1, 8, 8) and a.test.images.shape == (360, 1, 8, 8)
    assert a.train.images.dtype == torch.uint8 and int(a.train.images.max()) == 255
    assert torch.equal(a.test.images, b.test.images) and torch.equal(a.test.labels, b.test.labels)
    assert len(b.train) == 200 and torch.bincount(b.train.labels, minlength=10).min() >= 19
    assert not torch.equal(load_digits(seed=6, train_size=200).train.images, b.train.images)


# ----------------------------------------------------------------------------------------------- ResidentLoader


def _split(n: int, c: int = 3, h: int = 8, w: int = 8, seed: int = 0) -> DataSplit:
    """Random images whose label is their index, so a batch tells which originals it holds."""
    g = torch.Generator().manual_seed(seed)
    return DataSplit(images=torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8), labels=torch.arange(n))


MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Undo the normalisation: back to uint8 pixel values."""
    m, s = torch.tensor(MEAN).view(1, -1, 1, 1), torch.tensor(STD).view(1, -1, 1, 1)
    return ((x * s + m) * 255).round().to(torch.uint8)


def test_loader_batch_count_and_drop_last():
    split = _split(100)
    train = ResidentLoader(split, 32, "cpu", MEAN, STD, train=True)
    assert train.drop_last and len(train) == 3 and train.num_samples == 96
    assert [len(y) for _, y in train] == [32, 32, 32]
    keep_all = ResidentLoader(split, 32, "cpu", MEAN, STD, train=True, drop_last=False)
    assert len(keep_all) == 4 and keep_all.num_samples == 100
    assert sorted(torch.cat([y for _, y in keep_all]).tolist()) == list(range(100))  # each sample once
    small = ResidentLoader(_split(50), 32, "cpu", MEAN, STD, train=True)
    assert not small.drop_last and len(small) == 2
    with pytest.raises(ValueError, match="drop_last"):
        ResidentLoader(split, 32, "cpu", MEAN, STD, train=False, drop_last=True)
    with pytest.raises(ValueError, match="channel"):
        ResidentLoader(split, 32, "cpu", (0.5,), (0.2,), train=True)


def test_loader_epochs_are_deterministic_and_resumable():
    split = _split(64)

    def run(loader, epoch):
        loader.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in loader]

    a = ResidentLoader(split, 16, "cpu", MEAN, STD, train=True, seed=1)
    e3, e3_again, e4 = run(a, 3), run(a, 3), run(a, 4)
    resumed = run(ResidentLoader(split, 16, "cpu", MEAN, STD, train=True, seed=1), 3)
    for (x1, y1), (x2, y2), (x3, y3) in zip(e3, e3_again, resumed):
        assert torch.equal(x1, x2) and torch.equal(y1, y2) and torch.equal(x1, x3) and torch.equal(y1, y3)
    assert not torch.equal(torch.cat([y for _, y in e3]), torch.cat([y for _, y in e4]))
    other_seed = run(ResidentLoader(split, 16, "cpu", MEAN, STD, train=True, seed=2), 3)
    assert not torch.equal(torch.cat([y for _, y in e3]), torch.cat([y for _, y in other_seed]))
    # Without set_epoch, each new pass moves on to the next epoch instead of repeating the shuffle.
    a.set_epoch(3)
    first = torch.cat([y for _, y in a])
    second = torch.cat([y for _, y in a])
    assert torch.equal(first, torch.cat([y for _, y in e3])) and torch.equal(second, torch.cat([y for _, y in e4]))


def test_random_crop_flip_windows_match_offsets():
    images = _split(64).images
    pad = 4
    padded = F.pad(images, (pad,) * 4)
    crops, oy, ox, fl = random_crop_flip(padded, (8, 8), torch.Generator().manual_seed(0), flip=True)
    assert crops.shape == images.shape and crops.dtype == torch.uint8
    for b in range(len(images)):
        window = padded[b, :, oy[b] : oy[b] + 8, ox[b] : ox[b] + 8]
        assert torch.equal(crops[b], window.flip(-1) if fl[b] else window)
    assert fl.any() and (~fl).any()
    no_flip = random_crop_flip(padded, (8, 8), torch.Generator().manual_seed(0), flip=False)[3]
    assert not no_flip.any()


def test_random_crop_flip_distribution_is_uniform():
    pad, n = 4, 45_000
    padded = torch.zeros(n, 1, 2 + 2 * pad, 2 + 2 * pad, dtype=torch.uint8)
    _, oy, ox, fl = random_crop_flip(padded, (2, 2), torch.Generator().manual_seed(1234), flip=True)
    for offsets in (oy, ox):
        shifts = offsets - pad
        assert shifts.min() == -pad and shifts.max() == pad
        counts = torch.bincount(offsets, minlength=2 * pad + 1).double()
        expected = n / (2 * pad + 1)
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 40, f"offset counts {counts.tolist()} are far from uniform (chi2={chi2:.1f}, 8 dof)"
    flips = torch.bincount(fl.long(), minlength=2).double()
    assert ((flips - n / 2) ** 2 / (n / 2)).sum().item() < 20, flips.tolist()


def test_loader_crops_are_windows_of_the_zero_padded_original():
    split, pad = _split(48, h=6, w=6), 2
    loader = ResidentLoader(split, 16, "cpu", MEAN, STD, train=True, pad=pad, drop_last=False, seed=7)
    padded = F.pad(split.images, (pad,) * 4)
    # All (2p+1)^2 windows of every image, plus their mirrors: [N, K, C, H, W].
    windows = padded.unfold(2, 6, 1).unfold(3, 6, 1).permute(0, 2, 3, 1, 4, 5).reshape(48, -1, 3, 6, 6)
    candidates = torch.cat([windows, windows.flip(-1)], dim=1)
    used = set()
    for x, y in loader:
        got = _pixels(x)
        for img, label in zip(got, y.tolist()):
            match = (candidates[label] == img).flatten(1).all(1).nonzero().flatten().tolist()
            assert match, f"sample {label} is not a (mirrored) window of its padded original"
            used.update(match)
    k = windows.shape[1]
    assert len(used) > 10  # the crops really move around
    assert min(used) < k <= max(used)  # plain and mirrored windows both occur


def test_loader_normalization_channels_last_and_dtype():
    split = _split(10)
    loader = ResidentLoader(split, 4, "cpu", MEAN, STD, train=False, channels_last=True, dtype=torch.bfloat16)
    x, _ = next(iter(loader))
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    exact = ResidentLoader(split, 4, "cpu", MEAN, STD, train=False)
    x, _ = next(iter(exact))
    expected = (split.images[:4].float() / 255 - torch.tensor(MEAN).view(1, -1, 1, 1)) / torch.tensor(STD).view(1, -1, 1, 1)
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-6)


def test_eval_loader_is_ordered_complete_and_unaugmented():
    split = _split(37)
    loader = ResidentLoader(split, 10, "cpu", MEAN, STD, train=False)
    assert len(loader) == 4 and loader.num_samples == 37 and not loader.drop_last
    for _ in range(2):  # identical on every pass
        batches = list(loader)
        assert [len(y) for _, y in batches] == [10, 10, 10, 7]
        assert torch.equal(torch.cat([y for _, y in batches]), split.labels)
        assert torch.equal(_pixels(torch.cat([x for x, _ in batches])), split.images)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loader_gives_the_same_batches_on_cuda_and_cpu():
    split = _split(256, h=32, w=32)
    cpu = ResidentLoader(split, 64, "cpu", MEAN, STD, train=True, seed=3)
    gpu = ResidentLoader(split, 64, "cuda", MEAN, STD, train=True, seed=3)
    cpu.set_epoch(5)
    gpu.set_epoch(5)
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.device.type == "cuda" and torch.equal(yc, yg.cpu())
        torch.testing.assert_close(xc, xg.cpu(), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- real data


def test_real_cifar10_jpeg_folder_subset(cifar10_jpg):
    root = cifar10_jpg  # the one fixture that finds the copy, and the one skip message that names where it looked
    train, test, classes = read_image_folder(root, max_per_class=20, size=(32, 32))
    assert classes == CIFAR10_NAMES
    assert train.images.shape == (200, 3, 32, 32) and test.images.shape == (200, 3, 32, 32)
    assert torch.bincount(train.labels, minlength=10).tolist() == [20] * 10
    mean = train.images.float().mean(dim=(0, 2, 3)) / 255
    assert ((mean > 0.3) & (mean < 0.65)).all(), mean  # real photos, not blank or garbage


def test_a_num_classes_other_than_the_data_says_the_value_to_set(make_cfg, tmp_path):
    """dataset.num_classes=5 on the 10 digit classes: refused before anything is written, saying what to set."""
    from swalab.config import ConfigError
    from swalab.train import train

    cfg = make_cfg("method=sgd", "trainer.epochs=1", "dataset.num_classes=5", "run.device=cpu")
    with pytest.raises(ConfigError, match=r"dataset.num_classes=5 but the data at dataset.root has 10 classes "
                                          r"\(outputs of the model's head\): set dataset.num_classes=10$"):
        train(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
