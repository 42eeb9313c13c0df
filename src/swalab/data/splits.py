"""In-memory image data sets: the containers every loader in swalab returns.

All data sets used by swalab (CIFAR-10/100, the offline digits set) are small enough to hold decoded in
memory as one ``uint8`` tensor per split. Keeping them as plain tensors (rather than ``Dataset`` objects
that decode per item) is what lets :class:`~swalab.data.loader.ResidentLoader` move a whole split to the
GPU once and augment it with batched tensor ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DataSplit:
    """One split (train or test) of an image data set, decoded and resident in CPU memory.

    Attributes:
        images: ``uint8`` tensor ``[N, C, H, W]`` with raw pixel values 0..255 (no normalisation; the
            loader normalises on the training device, so the split stays 4x smaller than float32).
        labels: ``int64`` tensor ``[N]`` of class indices.

    The constructor checks dtypes and shapes so that a wrongly built split fails here, with a message
    saying what is wrong, rather than deep inside a training step.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.images, torch.Tensor) or self.images.dtype != torch.uint8 or self.images.dim() != 4:
            got = (self.images.dtype, tuple(self.images.shape)) if isinstance(self.images, torch.Tensor) else type(self.images)
            raise ValueError(f"DataSplit.images must be a uint8 tensor [N, C, H, W]; got {got}")
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
        name: short name used in configs and logs (``"cifar10"``, ``"cifar100"``, ``"digits"``).
        train: the training split (possibly capped by ``train_size``, see :func:`subset`).
        test: the test split; never subsampled, so test numbers stay comparable across runs.
        num_classes: number of classes; labels lie in ``[0, num_classes)``.
        classes: human-readable class names, index ``i`` naming label ``i``.
    """

    name: str
    train: DataSplit
    test: DataSplit
    num_classes: int
    classes: list[str]


def stratified_permutation(labels: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded permutation of ``range(len(labels))`` whose every prefix is class-balanced.

    Each class is shuffled on its own; the element of within-class rank ``k`` (of ``n_c``) gets the key
    ``(k + u) / n_c`` with ``u`` uniform in [0, 1), and the permutation sorts by key. Any prefix of
    length ``m`` therefore holds about ``m * n_c / N`` items of class ``c`` (within one item), so a
    small ``train_size`` keeps the class proportions of the full split instead of dropping rare classes.
    """
    y = labels.cpu().numpy()
    rng = np.random.default_rng(seed)
    keys = np.empty(len(y), dtype=np.float64)
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        rank = rng.permutation(len(members))
        keys[members] = (rank + rng.random(len(members))) / len(members)
    return torch.from_numpy(np.argsort(keys, kind="stable"))


def subset(split: DataSplit, size: int | None, seed: int) -> DataSplit:
    """The first ``size`` items of a fixed, seeded, class-stratified permutation of ``split``.

    Use it to cap the training set (``dataset.train_size``) for quick runs, learning curves or tests.
    Subsets are nested: for one seed, the items chosen for ``size=1000`` are among those chosen for
    ``size=2000``, so growing ``train_size`` only adds data. The chosen items keep their original order.

    Args:
        split: the split to take from.
        size: how many items to keep; ``None`` keeps the whole split (returned as is).
        seed: seeds the permutation; the same ``(seed, size)`` always picks the same items.

    Raises:
        ValueError: if ``size`` is not positive or exceeds ``len(split)``.
    """
    if size is None:
        return split
    if isinstance(size, bool) or int(size) != size:
        raise ValueError(f"dataset.train_size must be an integer or null, got {size!r}")
    size = int(size)
    if size < 1 or size > len(split):
        raise ValueError(
            f"dataset.train_size={size} is out of range: the training split has {len(split)} items; "
            f"use a value in [1, {len(split)}] or null for all of them"
        )
    if size == len(split):
        return split
    keep = stratified_permutation(split.labels, seed)[:size].sort().values
    return DataSplit(images=split.images[keep], labels=split.labels[keep])
