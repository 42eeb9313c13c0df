"""In-memory image data sets: the containers every loader in swalab returns.

The resident data sets of swalab (CIFAR-10/100, the offline digits set, small image folders) are small
enough to hold decoded in memory as one ``uint8`` tensor per split. Keeping them as plain tensors (rather
than ``Dataset`` objects that decode per item) is what lets :class:`~swalab.data.loader.ResidentLoader`
move a whole split to the GPU once and augment it with batched tensor ops."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

TEST_SUBSET_SEED = 0  # test_size subsets are drawn with this seed, never the run seed
# The validation split (dataset.val_size) is drawn with this seed, never the run seed: every seed and every method holds
# out the same images, so a seed ensemble's members are calibrated on one split and their val scores can be compared.
# Another constant than TEST_SUBSET_SEED, so that the held-out images are not the ones seed 0's train_size subset starts with.
VAL_SPLIT_SEED = 7919

# The pixel types a split may hold and the value of a full-scale pixel in each: 8-bit images (every loader) and
# 16-bit grey images (PNG/TIFF ``I;16``, read at their full depth by swalab.data.folder). The loaders divide by it,
# so pixels of either depth reach the model as [0, 1] before normalisation.
PIXEL_MAX = {torch.uint8: 255, torch.uint16: 65535}


def pixel_max(images: torch.Tensor) -> int:
    """The value of a full-scale pixel of ``images`` (:data:`PIXEL_MAX`): 255 for ``uint8``, 65535 for ``uint16``."""
    return PIXEL_MAX[images.dtype]


@dataclass
class DataSplit:
    """One split (train or test) of an image data set, decoded and resident in CPU memory.

    Attributes:
        images: ``uint8`` tensor ``[N, C, H, W]`` with raw pixel values 0..255, or ``uint16`` with 0..65535 for
            16-bit images (no normalisation; the loader normalises on the training device, so the split stays 4x
            (2x) smaller than float32).
        labels: ``int64`` tensor ``[N]`` of class indices.

    The constructor checks dtypes and shapes so that a wrongly built split fails here, with a message
    saying what is wrong, rather than deep inside a training step."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.images, torch.Tensor) or self.images.dtype not in PIXEL_MAX or self.images.dim() != 4:
            got = (self.images.dtype, tuple(self.images.shape)) if isinstance(self.images, torch.Tensor) else type(self.images)
            raise ValueError(f"DataSplit.images must be a uint8 or uint16 tensor [N, C, H, W]; got {got}")
        if not isinstance(self.labels, torch.Tensor) or self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            got = (self.labels.dtype, tuple(self.labels.shape)) if isinstance(self.labels, torch.Tensor) else type(self.labels)
            raise ValueError(f"DataSplit.labels must be an int64 tensor [N]; got {got}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"DataSplit has {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class ImageData:
    """A whole data set: both splits plus the label names.

    Attributes:
        name: short name used in configs and logs (``"cifar10"``, ``"cifar100"``, ``"digits"``, ``"folder"``).
        train: the training split (possibly capped by ``train_size``, see :func:`subset`).
        test: the test split (possibly capped by ``test_size``, see :func:`cap_test_split`: a fixed subset,
            the same for every run seed, so test numbers stay comparable across runs).
        num_classes: number of classes; labels lie in ``[0, num_classes)``.
        classes: human-readable class names, index ``i`` naming label ``i``.
        channels: image channels (1 or 3); left ``None``, it is read from ``train.images``.
        mean, std: per-channel normalisation measured on the training images (pixels scaled to [0, 1]),
            for loaders that measure it (:func:`~swalab.data.folder_dataset.load_folder`); ``None`` when
            the loader leaves normalisation to the config.
        record: the record of the files read (``swalab.data.fingerprint``: per class folder a count and a
            hash, and one fingerprint), for the run's identity; ``None`` for data a loader cannot describe.
        cache_note: a line saying where the decoded images were cached, when this load wrote the cache.
        val: the validation split held out of the training images (``dataset.val_size``, :func:`hold_out`), or
            ``None``; ``train`` then holds none of its images."""

    name: str
    train: DataSplit
    test: DataSplit
    num_classes: int
    classes: list[str]
    channels: int | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    record: dict | None = None
    cache_note: str | None = None
    val: DataSplit | None = None

    def __post_init__(self) -> None:
        found = int(self.train.images.shape[1])
        if self.channels is None:
            self.channels = found
        if self.channels != found or self.test.images.shape[1] != found:
            raise ValueError(f"ImageData {self.name!r} says channels={self.channels} but its images have "
                             f"{found} (train) and {self.test.images.shape[1]} (test)")
        if self.val is not None and self.val.images.shape[1:] != self.train.images.shape[1:]:
            raise ValueError(f"ImageData {self.name!r}: its validation images are {tuple(self.val.images.shape[1:])}, "
                             f"its training images {tuple(self.train.images.shape[1:])}")
        for key, value in (("mean", self.mean), ("std", self.std)):
            if value is not None and len(value) != self.channels:
                raise ValueError(f"ImageData {self.name!r}: {key} has {len(value)} values for {self.channels} channels")


def check_size(size, key: str, available: int, what: str) -> int | None:
    """``size`` as an ``int`` in ``[1, available]``, or ``None`` (all items), for a ``*_size`` config key.

    Integers and integral floats (``500.0``) pass. ``True``, ``2.5``, ``"abc"`` and values outside the
    range raise ``ValueError`` naming ``key`` (e.g. ``dataset.test_size``) and, when out of range, how
    many items ``what`` (the split, in words) holds. A command's flag (``--test-size``) is left out for all items,
    where a config key is null."""
    if size is None:
        return None
    integral = isinstance(size, numbers.Integral) or (isinstance(size, float) and size.is_integer())
    if isinstance(size, bool) or not integral:
        raise ValueError(f"{key} must be an integer or null, got {size!r}")
    size = int(size)
    if size < 1 or size > available:
        every = "; leave it out" if key.startswith("--") else " or null"
        raise ValueError(f"{key}={size} is out of range: {what} has {available} items; "
                         f"use a value in [1, {available}]{every} for all of them")
    return size


def subset_indices(labels: torch.Tensor, size: int | None, seed: int, key: str = "dataset.train_size",
                   what: str = "the training split") -> torch.Tensor | None:
    """The sorted indices :func:`subset` keeps, or ``None`` when it keeps everything.

    Needs only the labels, so an image-folder loader can choose its files before decoding any of them
    and decode only those (see :func:`swalab.data.folder.select_files`)."""
    size = check_size(size, key, len(labels), what)
    if size is None or size == len(labels):
        return None
    return stratified_permutation(labels, seed)[:size].sort().values


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of ``uint8`` or ``uint16`` images ``[N, C, H, W]``, pixels scaled to
    [0, 1] (divided by :func:`pixel_max`).

    Use it to measure normalisation constants on the training images. The standard deviation is the
    population one (divided by the pixel count, numpy's default) over every pixel of every image. Sums
    are exact integers accumulated ``chunk`` images at a time, so a large split needs no float copy."""
    if images.dtype not in PIXEL_MAX or images.dim() != 4 or len(images) == 0:
        raise ValueError(f"channel_stats needs a non-empty uint8 or uint16 tensor [N, C, H, W], got {images.dtype} "
                         f"{tuple(images.shape)}")
    total = torch.zeros(images.shape[1], dtype=torch.int64)
    squares = torch.zeros(images.shape[1], dtype=torch.int64)
    for start in range(0, len(images), chunk):
        x = images[start : start + chunk].to(torch.int64)
        total += x.sum(dim=(0, 2, 3))
        squares += (x * x).sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    top = float(pixel_max(images))
    mean = total.double() / count / top
    var = squares.double() / count / top**2 - mean**2
    return mean.tolist(), var.clamp_min(0).sqrt().tolist()


def stratified_permutation(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded permutation of ``range(len(labels))`` whose every prefix is class-balanced.

    Each class is shuffled on its own; the element of within-class rank ``k`` (of ``n_c``) gets the key
    ``(k + u) / n_c`` with ``u`` uniform in [0, 1), and the permutation sorts by key. Any prefix of
    length ``m`` therefore holds about ``m * n_c / N`` items of class ``c`` (within one item), so a
    small ``train_size`` keeps the class proportions of the full split instead of dropping rare classes."""
    y = labels.cpu().numpy()
    rng = np.random.default_rng(seed)
    keys = np.empty(len(y), dtype=np.float64)
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        rank = rng.permutation(len(members))
        keys[members] = (rank + rng.random(len(members))) / len(members)
    return torch.from_numpy(np.argsort(keys, kind="stable"))


def subset(split: DataSplit, size: int | None, seed: int, key: str = "dataset.train_size",
           what: str = "the training split") -> DataSplit:
    """The first ``size`` items of a fixed, seeded, class-stratified permutation of ``split``.

    Use it to cap the training set (``dataset.train_size``) for quick runs, learning curves or tests.
    Subsets are nested: for one seed, the items chosen for ``size=1000`` are among those chosen for
    ``size=2000``, so growing ``train_size`` only adds data. The chosen items keep their original order.

    Args:
        split: the split to take from.
        size: how many items to keep; ``None`` keeps the whole split (returned as is).
        seed: seeds the permutation; the same ``(seed, size)`` always picks the same items.
        key, what: the config key and the split named in error messages.

    Raises:
        ValueError: if ``size`` is not an integer, not positive or exceeds ``len(split)``."""
    keep = subset_indices(split.labels, size, seed, key, what)
    if keep is None:
        return split
    if hasattr(split, "subset"):  # a split read from disk on demand (ImageNet's ImageFolderSplit): its own subset
        return split.subset(keep.tolist())
    return DataSplit(images=split.images[keep], labels=split.labels[keep])


def cap_test_split(split: DataSplit, size: int | None, key: str = "dataset.test_size") -> DataSplit:
    """Cap a test split at ``size`` items (``dataset.test_size``, or ``key``): a class-stratified subset, seed 0.

    The seed is fixed (:data:`TEST_SUBSET_SEED`), never the run seed, so every seed of an experiment is
    scored on the same test images and their accuracies can be averaged and compared. ``None`` keeps the
    whole split."""
    return subset(split, size, TEST_SUBSET_SEED, key=key, what="the test split")



# -- the validation split (dataset.val_size) ----------------------------------------------------------

VAL_KEY = "dataset.val_size"


def val_count(val_size, available: int, key: str = VAL_KEY) -> int:
    """How many of ``available`` training images ``val_size`` holds out: 0 for ``None`` or 0 (no validation split);
    an integer is a number of images, a float strictly between 0 and 1 a fraction (rounded to whole images).

    Raises ``ValueError`` naming ``key`` for anything else (``True``, ``1.5``, NaN, a negative number) and when the
    split would hold no image or leave none to train on. The one check of ``dataset.val_size``: every loader calls
    it (through :func:`hold_out`) before anything is written."""
    if val_size is None:
        return 0
    if isinstance(val_size, bool) or not isinstance(val_size, numbers.Real):
        raise ValueError(f"{key}={val_size!r} must be a number of images (an integer), a fraction in (0, 1), or "
                         "null for no validation split")
    if isinstance(val_size, numbers.Integral):
        count = int(val_size)
    elif not math.isfinite(val_size) or not 0 <= val_size < 1:
        raise ValueError(f"{key}={val_size!r}: a fraction of the training images must lie in (0, 1), a number of "
                         "images must be an integer (write 5000, not 5000.0); null or 0: no validation split")
    else:
        count = int(round(val_size * available))
        if val_size > 0 and count == 0:
            raise ValueError(f"{key}={val_size!r} is {val_size:g} of {available} training images: not one image. "
                             "Raise it, or give a number of images")
    if count < 0:
        raise ValueError(f"{key}={val_size!r} must be >= 0 (0 or null: no validation split)")
    if count >= available:
        raise ValueError(f"{key}={val_size!r} holds out {count} of the {available} training images, leaving none to "
                         f"train on: lower {key} below {available}")
    return count


def hold_out(labels: torch.Tensor, val_size, classes: Sequence[str] | None = None,
             key: str = VAL_KEY) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The indices ``(train, val)`` (each sorted) of a validation split of :func:`val_count` images held out of a
    training split of ``labels``, or ``None`` without one.

    The split is the prefix of a class-stratified permutation (:func:`stratified_permutation`) drawn with
    :data:`VAL_SPLIT_SEED`, never the run seed: its class proportions are the training split's, and every run of a
    data set, whatever its seed or method, holds out the same images. Needs only the labels, so an image folder
    chooses its files before decoding any. A split that would take every training image of a class is refused,
    naming the classes (``classes`` gives their names) and ``key``."""
    count = val_count(val_size, len(labels), key)
    if count == 0:
        return None
    order = stratified_permutation(labels, VAL_SPLIT_SEED)
    check_every_class_held(labels[order], count, val_size, key)
    val, train = order[:count].sort().values, order[count:].sort().values
    emptied = sorted(set(labels.tolist()) - set(labels[train].tolist()))
    if emptied:
        names = [classes[c] if classes is not None and c < len(classes) else str(c) for c in emptied]
        ordered = labels[order]  # the split is a prefix of this order: it must stop before a class's last image
        most = min(int((ordered == c).nonzero()[-1]) for c in ordered.unique().tolist())
        raise ValueError(f"{key}={val_size!r} would hold out every training image of class {', '.join(names[:10])}"
                         f"{' ...' if len(names) > 10 else ''}, leaving it nothing to train on: lower {key} to "
                         f"{most} or less")
    return train, val


def check_every_class_held(ordered: torch.Tensor, count: int, val_size, key: str = VAL_KEY) -> None:
    """Refuse a validation split (the first ``count`` of the training labels in their stratified order, ``ordered``)
    that misses a class of the training images: a temperature fitted on a few images of a few classes lies at its
    search bound (one image of one class gave swa+ts an NLL of 10.9 against 1.96 unscaled). The refusal names the
    smallest split that holds every class. A class of one training image need not be held (it would leave
    training without it, which :func:`hold_out` refuses)."""
    classes, counts = ordered.unique(return_counts=True)
    classes = classes[counts > 1]
    held = [c for c in ordered[:count].unique().tolist() if c in set(classes.tolist())]
    if len(held) == len(classes):
        return
    needed = max(int((ordered == c).nonzero()[0]) for c in classes.tolist()) + 1
    raise ValueError(f"{key}={val_size!r} holds out {count} image{'s' if count > 1 else ''}, of {len(held)} of the "
                     f"{len(classes)} classes: too few to fit the temperature of the +ts predictors on. Hold out at "
                     f"least one image of every class: {key}={needed} or more (null: no validation split)")


def split_off_val(split: DataSplit, val_size, classes: Sequence[str] | None = None,
                  key: str = VAL_KEY) -> tuple[DataSplit, DataSplit | None]:
    """``(the training images left, the validation split)`` of :func:`hold_out`; ``(split, None)`` without one."""
    chosen = hold_out(split.labels, val_size, classes, key)
    if chosen is None:
        return split, None
    train, val = chosen
    return (DataSplit(images=split.images[train], labels=split.labels[train]),
            DataSplit(images=split.images[val], labels=split.labels[val]))


def after_val(what: str, val: DataSplit | None) -> str:
    """How an error about ``dataset.train_size`` names the split it was cut from (``the training split`` less the
    validation images, when there are any)."""
    return what if val is None else f"{what} less the {len(val)} validation images (dataset.val_size)"
