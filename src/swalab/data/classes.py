"""Train on some of a data set's classes (``dataset.classes``); the others' test images are out-of-distribution.

When and why: the SWAG paper's split-class CIFAR-10 trains on five classes and sets the other five's test images
against them as out-of-distribution (``python -m swalab.results.score <run> --ood other-classes``, docs/shift.md).
``dataset.classes`` lists the class indices kept (in the data set's label order); every split keeps only their images,
relabelled 0..k-1 in the order given, and the network gets k outputs. The data set's own caps
(``dataset.train_size``, ``test_size``, ``val_size``) are taken first, over all its classes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from swalab.config import ConfigError
from swalab.data.splits import DataSplit, ImageData

KEY = "dataset.classes"


class ClassesError(ConfigError):
    """A ``dataset.classes`` that names no proper subset of the data set's classes: one line with the fix."""


def check_classes(classes: Sequence[int], num_classes: int) -> list[int]:
    """``classes`` as a list of distinct indices in [0, num_classes), at least two, not all; else ClassesError."""
    kept = [int(c) for c in classes]
    if len(set(kept)) != len(kept) or any(c < 0 or c >= num_classes for c in kept) or not 2 <= len(kept) < num_classes:
        raise ClassesError(f"{KEY}={list(classes)}: give two or more distinct class indices in 0..{num_classes - 1}, "
                           f"fewer than all {num_classes} (e.g. {KEY}=[0,1,2,3,4])")
    return kept


def _keep(split: DataSplit, classes: list[int]) -> DataSplit:
    relabel = torch.full((max(classes) + 1,), -1, dtype=torch.long)
    relabel[torch.tensor(classes)] = torch.arange(len(classes))
    mask = torch.isin(split.labels, torch.tensor(classes))
    return DataSplit(split.images[mask], relabel[split.labels[mask]])


def keep_classes(data: ImageData, classes: Sequence[int] | None) -> ImageData:
    """``data`` with only ``classes`` in every split, relabelled 0..k-1 in their order; ``data`` itself for None."""
    if classes is None:
        return data
    kept = check_classes(classes, data.num_classes)
    return dataclasses.replace(data, train=_keep(data.train, kept), test=_keep(data.test, kept),
                               val=_keep(data.val, kept) if data.val is not None else None,
                               num_classes=len(kept), classes=[data.classes[c] for c in kept])


def other_classes(data: ImageData, classes: Sequence[int]) -> DataSplit:
    """The test images of the classes ``classes`` leaves out (labels as in ``data``: never read as targets)."""
    kept = check_classes(classes, data.num_classes)
    mask = ~torch.isin(data.test.labels, torch.tensor(kept))
    return DataSplit(data.test.images[mask], data.test.labels[mask])
