"""Any image folder as a resident data set: ``root/train/<class>/*`` and ``root/test/<class>/*``.

Use :func:`load_folder` (``dataset=folder``) for a data set that has no loader of its own: the class
count and names come from the folder names, images may have any size (or be resized to one), grey or
colour, and the normalisation constants are measured on the training images unless given. Like CIFAR's
image folder it decodes once, caches the decoded tensors (:mod:`swalab.data.cache`) and decodes only
the files a ``train_size`` / ``test_size`` subset keeps."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from .cache import cache_path, cached
from .fingerprint import folder_record, records_files
from .folder import (IMAGE_EXTENSIONS, SPLITS, decode_images, infer_channels, list_image_folder, select_files,
                     selection_digest)
from .splits import DataSplit, ImageData, channel_stats

STATS_KEYS = ("channels", "mean", "std")  # cached beside the pixels: measured once per set of chosen files


def _check_root(root) -> Path:
    if root is None or str(root).strip() in ("", "???"):
        raise ValueError("dataset.root is not set: set dataset.root=DIR, the folder holding train/<class>/* and "
                         "test/<class>/*")
    return Path(root).expanduser().resolve()


def _check_image_size(image_size) -> int | None:
    if image_size is None:
        return None
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"dataset.image_size={image_size!r} must be a positive integer (the side of the square "
                         "every image is resized to) or null to keep the images' own size")
    return image_size


def _check_channels(channels) -> int | None:
    if channels is None:
        return None
    if isinstance(channels, bool) or channels not in (1, 3):
        raise ValueError(f"dataset.channels={channels!r} is not supported: use 1 (grayscale), 3 (RGB) or null "
                         "(1 if every training image is grey, else 3)")
    return int(channels)


def _check_stat(value, key: str, channels: int) -> list[float] | None:
    """A given ``dataset.mean`` / ``dataset.std`` as floats, one per channel, or ``None`` if not given."""
    if value is None:
        return None
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError(value)
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} must be a list of {channels} numbers, one per channel "
                         "(or null to measure it on the training images)") from None
    if len(values) != channels:
        raise ValueError(f"{key} has {len(values)} values but the images have {channels} channel(s): give one per "
                         "channel, or null to measure it on the training images")
    if key.endswith("std") and not all(v > 0 for v in values):
        raise ValueError(f"{key}={values} must be positive (each channel is divided by it)")
    return values


def _decode(files: dict, chosen: dict, channels: int | None, image_size: int | None) -> dict:
    """Decode the chosen files and measure the training images' mean and std: the cache payload."""
    if channels is None:  # from the whole training split, so the choice never depends on the seed
        channels = infer_channels([path for path, _ in files["train"]])
    splits = [s for s in ("train", "test", "val") if s in chosen]
    pairs = [pair for s in splits for pair in chosen[s]]
    hint = "; set dataset.image_size=N to resize every image to N x N pixels" if image_size is None else ""
    # every split in one call: every test (and validation) image must match the first training image's size too
    images = decode_images([path for path, _ in pairs], mode="L" if channels == 1 else "RGB", resize=image_size,
                           hint=hint)
    out, start = {}, 0
    for s in splits:
        stop = start + len(chosen[s])
        out[f"{s}_images"] = images[start:stop].clone()  # clone: save no shared storage
        out[f"{s}_labels"] = _labels(chosen[s])
        start = stop
    mean, std = channel_stats(out["train_images"])  # the training images only, never the validation split
    return {**out, "channels": channels, "mean": mean, "std": std}


def _labels(pairs: list[tuple[str, int]]) -> torch.Tensor:
    return torch.tensor([label for _, label in pairs], dtype=torch.int64)


def files_record(root: str | Path, cache_dir: str | Path | None = None, **_) -> dict:
    """The record of the files :func:`load_folder` reads (``swalab.data.fingerprint``)."""
    return folder_record(_check_root(root), SPLITS, IMAGE_EXTENSIONS, cache_dir)


@records_files(files_record)
def load_folder(root: str | Path, image_size: int | None = None, channels: int | None = None,
                mean: list[float] | None = None, std: list[float] | None = None, train_size: int | None = None,
                test_size: int | None = None, seed: int = 0, cache: bool = True, cache_dir: str | Path | None = None,
                name: str = "folder", record: dict | None = None, val_size: int | float | None = None) -> ImageData:
    """Load ``root/train/<class>/*`` and ``root/test/<class>/*`` as ``uint8`` tensors ``[N, C, H, W]``.

    Class folders are sorted by name and numbered from 0 (any count); both splits must have the same class folders,
    none of them empty. Files are read in sorted order; hidden files and files without an image extension are ignored.

    Args:
        root: ``dataset.root``, the folder holding ``train/`` and ``test/``.
        image_size: resize every image to ``image_size`` x ``image_size`` pixels (bilinear, the aspect ratio not
            kept: ``folder._decode_image``); ``None`` keeps the images' own size, which must then be the same for all.
        channels: 1 converts every image to grayscale (16-bit grey stays 16-bit: ``folder.decode_images``), 3 to
            RGB; ``None``: 1 if every image of the *whole* training split is grey (``folder.infer_channels``, reading
            headers only; not the ``train_size`` subset, so the seed never decides it), else 3.
        mean, std: per-channel normalisation of the pixels scaled to [0, 1]; ``None`` measures it (population std) on
            the training images used, after ``train_size``, resizing and conversion, and caches it with the pixels.
        train_size, test_size, val_size, seed, cache_dir, record: ``swalab.data``'s module doc; the
            normalisation is measured without the validation images.
        cache: keep the decoded tensors and measured statistics (``swalab.data.cache.cache_path``), a file per
            choice of files, ``channels`` and ``image_size``; rebuilt when a file of the folder changes.
        name: the data set's name in :class:`ImageData` and in the cache file name.

    Raises ValueError (``root`` not set, a bad key, an empty or mismatched class folder, images of different sizes
    without ``image_size``, an unreadable image) or FileNotFoundError (``root`` or a split missing), naming the key,
    folder or file concerned."""
    root = _check_root(root)
    image_size = _check_image_size(image_size)
    channels = _check_channels(channels)
    classes, files = list_image_folder(root)
    chosen = select_files(files, train_size, test_size, seed, val_size, classes)
    record = record or files_record(root, cache_dir)
    options = {"chosen": selection_digest(chosen, root), "channels": channels, "image_size": image_size}
    source = {"layout": "folder", "loader": "load_folder", **options,
              "num_files": sum(len(v) for v in files.values()), "fingerprint": record["fingerprint"]}
    variant = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_path(root, name, "folder", cache_dir, variant) if cache else None
    got, note = cached(path, source, lambda: {**_decode(files, chosen, channels, image_size), "classes": classes},
                       keys=STATS_KEYS + (("val_images", "val_labels") if "val" in chosen else ()))
    found = int(got["channels"])
    mean = _check_stat(mean, "dataset.mean", found) or [float(v) for v in got["mean"]]
    std = _check_stat(std, "dataset.std", found) or [float(v) for v in got["std"]]
    flat = [c for c, v in enumerate(std) if v <= 0]
    if flat:
        raise ValueError(f"the training images under {root / 'train'} are constant in channel(s) {flat} (measured std "
                         "0), so they cannot be normalised: set dataset.std explicitly")
    split = lambda s: DataSplit(images=got[f"{s}_images"], labels=got[f"{s}_labels"])  # noqa: E731
    return ImageData(name=name, train=split("train"), test=split("test"), num_classes=len(classes),
                     classes=list(got["classes"]), channels=found, mean=mean, std=std, record=record, cache_note=note,
                     val=split("val") if "val" in chosen else None)
