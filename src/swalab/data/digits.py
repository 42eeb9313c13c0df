"""scikit-learn's 8x8 handwritten digits: the offline default data set.

1,797 grey-scale 8x8 images of the digits 0-9 ship inside the scikit-learn package, so this data set
needs no download and no data folder. It is what the shipped default config, the smoke tests and the
end-to-end tests train on: a few seconds on a CPU are enough to see SGD, SWA and FGE differ. It says
nothing about CIFAR-scale accuracy; use it to check that the machinery runs, not to reproduce the paper."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from .fingerprint import data_record, records_files

from .splits import DataSplit, ImageData, after_val, cap_test_split, split_off_val, subset

SPLIT_SEED = 0


def files_record(**_) -> dict:
    """The record of the digits (``swalab.data.fingerprint``): a hash of scikit-learn's arrays, so a
    scikit-learn release that changed them would be another data set."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    text = hashlib.sha256(np.ascontiguousarray(bunch.images).tobytes() + bunch.target.astype(np.int64).tobytes())
    return data_record(text.hexdigest())


@records_files(files_record)
def load_digits(train_size: int | None = None, seed: int = 0, test_fraction: float = 0.2,
                test_size: int | None = None, val_size: int | float | None = None,
                record: dict | None = None) -> ImageData:
    """Load the digits as ``uint8`` images ``[N, 1, 8, 8]`` with a fixed stratified train/test split.

    The pixel values 0..16 are scaled to 0..255 (``round(v * 255 / 16)``) so that the same
    normalisation code (``x / 255``) serves every data set.

    ``test_fraction`` of the 1,797 images are held out as the test set (stratified by class), always with seed 0,
    so the test set is the same for every run and seed. The caps: ``swalab.data``'s module doc."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}")
    bunch = sklearn_digits()
    images = torch.from_numpy(np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=test_fraction, stratify=bunch.target,
                                           random_state=SPLIT_SEED)
    train_idx, test_idx = torch.from_numpy(np.sort(train_idx)), torch.from_numpy(np.sort(test_idx))
    train = DataSplit(images=images[train_idx], labels=labels[train_idx])
    test = DataSplit(images=images[test_idx], labels=labels[test_idx])
    classes = [str(d) for d in range(10)]
    train, val = split_off_val(train, val_size, classes)
    return ImageData(name="digits", train=subset(train, train_size, seed, what=after_val("the training split", val)),
                     val=val, test=cap_test_split(test, test_size), num_classes=10, classes=classes, channels=1,
                     record=record or files_record())
