"""CIFAR-10 and CIFAR-100, read from torchvision's pickles or from an image folder.

Two layouts are accepted under ``dataset.root``; which one is used is decided by what the folder holds:

(a) torchvision's pickle layout, ``root/cifar-10-batches-py/`` or ``root/cifar-100-python/`` (or
    ``root`` being that folder itself). These are the original pixels. The pickles are read directly,
    without building a torchvision ``Dataset``: the arrays already are the whole split.
(b) an image folder, ``root/train/<class>/*`` and ``root/test/<class>/*``, such as the JPEG copy of
    CIFAR-10. Class indices follow the sorted folder names, which for CIFAR is the standard label order.
    Decoding is slow, so the decoded tensors are cached in the user's cache directory (see
    :mod:`swalab.data.cache`). JPEG copies are lossy: expect accuracies somewhat below the pickles'.

If both are present the pickles win (exact pixels). If neither is, ``download=True`` asks torchvision
to fetch the pickles; without internet access that fails with a message saying how else to get them.
Nothing is downloaded at import time."""

from __future__ import annotations

import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .cache import cache_path, cached
from . import fingerprint
from .fingerprint import folder_record, records_files
from .folder import (IMAGE_EXTENSIONS, SPLITS, decode_split, has_image_folder, list_image_folder, select_files,
                     selection_digest)
from .splits import DataSplit, ImageData, after_val, cap_test_split, split_off_val, subset


@dataclass(frozen=True)
class _CifarSpec:
    name: str
    title: str
    num_classes: int
    pickle_dir: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    torchvision_class: str


_SPECS = {
    "cifar10": _CifarSpec("cifar10", "CIFAR-10", 10, "cifar-10-batches-py",
                          tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta", "labels",
                          "label_names", "CIFAR10"),
    "cifar100": _CifarSpec("cifar100", "CIFAR-100", 100, "cifar-100-python", ("train",),
                           "test", "meta", "fine_labels", "fine_label_names", "CIFAR100"),
}
IMAGE_SIZE = (32, 32)


def _spec(name: str) -> _CifarSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown CIFAR data set {name!r}; expected one of {sorted(_SPECS)}") from None


def _layout_help(spec: _CifarSpec, root_arg: str | Path, root: Path) -> str:
    pickle_files = ", ".join((*spec.train_files, spec.test_file, spec.meta_file))
    exts = "|".join(e.lstrip(".") for e in IMAGE_EXTENSIONS[:3])
    return (
        f"  dataset.root = {str(root_arg)!r} (resolved: {root})\n"
        f"Expected one of these layouts there:\n"
        f"  (a) torchvision's pickle layout: {root / spec.pickle_dir}/{{{pickle_files}}}\n"
        f"  (b) an image folder: {root}/train/<class>/*.{{{exts},...}} and {root}/test/<class>/*, "
        f"{spec.num_classes} class folders whose sorted names give the label order\n"
        f"To get them: run the command once on a machine with internet access, with run.download=true "
        f"(the default: torchvision fetches the pickles into dataset.root), or copy either layout from a "
        f"machine that has it and point dataset.root at the folder holding it."
    )


def _find_pickle_dir(root: Path, spec: _CifarSpec) -> Path | None:
    if (root / spec.pickle_dir).is_dir():
        return root / spec.pickle_dir
    if (root / spec.train_files[0]).is_file() and (root / spec.test_file).is_file():
        return root  # dataset.root points at the pickle folder itself
    return None


def _load_pickle(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the pickle layout needs it (re-download or copy it)")
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="latin1")
    except Exception as err:  # UnpicklingError, EOFError, ValueError...: all mean a damaged file
        raise ValueError(f"cannot read CIFAR pickle {path}: {type(err).__name__}: {err}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"CIFAR pickle {path} holds a {type(obj).__name__}, expected a dict")
    # Python-2 pickles (the originals) have str keys under latin1; files re-pickled in Python 3 may have bytes keys.
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_batch(path: Path, spec: _CifarSpec) -> tuple[np.ndarray, np.ndarray]:
    d = _load_pickle(path)
    for key in ("data", spec.label_key):
        if key not in d:
            raise ValueError(f"CIFAR pickle {path} has no {key!r} entry (it has {sorted(d)})")
    data = np.asarray(d["data"])
    labels = np.asarray(d[spec.label_key])
    if data.ndim != 2 or data.shape[1] != 3 * IMAGE_SIZE[0] * IMAGE_SIZE[1]:
        raise ValueError(f"CIFAR pickle {path}: 'data' has shape {data.shape}, expected [N, 3072]")
    if data.dtype != np.uint8:
        if not np.issubdtype(data.dtype, np.integer) or (data.size and (data.min() < 0 or data.max() > 255)):
            raise ValueError(f"CIFAR pickle {path}: 'data' must hold uint8 pixel values, got {data.dtype}")
        data = data.astype(np.uint8)
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"CIFAR pickle {path}: {spec.label_key!r} must be {len(data)} integers (one per image), "
                         f"got {labels.dtype} of shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise ValueError(f"CIFAR pickle {path}: labels range over [{labels.min()}, {labels.max()}] but {spec.title} "
                         f"has classes 0..{spec.num_classes - 1} (is this a {spec.title} file?)")
    return data, labels.astype(np.int64)


def _to_split(parts: list[tuple[np.ndarray, np.ndarray]]) -> DataSplit:
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    # Each row is the red plane, then green, then blue, each 32x32 in row-major order.
    images = torch.from_numpy(data).reshape(len(data), 3, *IMAGE_SIZE)
    return DataSplit(images=images, labels=torch.from_numpy(labels))


def read_cifar_pickles(pickle_dir: str | Path, name: str) -> tuple[DataSplit, DataSplit, list[str]]:
    """Read torchvision's CIFAR pickles from ``pickle_dir`` into ``(train, test, classes)``.

    Each file that is missing, damaged, or holds the wrong shape or out-of-range labels raises an
    error naming it. CIFAR-100 uses the 100 fine labels."""
    spec = _spec(name)
    pickle_dir = Path(pickle_dir)
    meta_path = pickle_dir / spec.meta_file
    meta = _load_pickle(meta_path)
    if spec.names_key not in meta:
        raise ValueError(f"CIFAR meta file {meta_path} has no {spec.names_key!r} entry (it has {sorted(meta)})")
    classes = [c.decode() if isinstance(c, bytes) else str(c) for c in meta[spec.names_key]]
    if len(classes) != spec.num_classes:
        raise ValueError(f"CIFAR meta file {meta_path} lists {len(classes)} class names, {spec.title} has {spec.num_classes}")
    train = _to_split([_read_batch(pickle_dir / f, spec) for f in spec.train_files])
    test = _to_split([_read_batch(pickle_dir / spec.test_file, spec)])
    return train, test, classes


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what ``mkdir(parents=True)`` creates)."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _download(root: Path, spec: _CifarSpec, root_arg: str | Path) -> None:
    """Let torchvision fetch the pickles into ``root``; on failure, remove the folders this created.

    A failed download (no internet, a checksum error) must not leave an empty or half-filled
    ``dataset.root`` behind: the next run would then find a folder that looks like data. Only folders
    that did not exist before the attempt are removed; a ``root`` that already existed is left as is."""
    import torchvision.datasets  # imported here: only a download needs it

    dataset_class = getattr(torchvision.datasets, spec.torchvision_class)
    created = _first_missing(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        dataset_class(str(root), train=True, download=True)  # fetches and unpacks both splits
    except Exception as err:  # URLError, socket timeouts, checksum RuntimeError, PermissionError...
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise RuntimeError(
            f"No {spec.title} data under dataset.root, and downloading it failed "
            f"({type(err).__name__}: {err}). This machine may have no internet access.\n"
            + _layout_help(spec, root_arg, root)
        ) from err


def files_record(name: str, root: str | Path, cache_dir: str | Path | None = None, **_) -> dict | None:
    """The record of the files :func:`load_cifar` reads (``swalab.data.fingerprint``): its pickles, or its image
    folder; None while neither is there (a download is still to come)."""
    spec = _spec(name)
    root = Path(root).expanduser().resolve()
    pickle_dir = _find_pickle_dir(root, spec)
    if pickle_dir is not None:
        names = (*spec.train_files, spec.test_file, spec.meta_file)
        return fingerprint.files_record({n: pickle_dir / n for n in names if (pickle_dir / n).is_file()}, cache_dir)
    if has_image_folder(root):
        return folder_record(root, SPLITS, IMAGE_EXTENSIONS, cache_dir)
    return None


def _load_image_folder(root: Path, spec: _CifarSpec, cache: bool, cache_dir: Path | None = None,
                       train_size: int | None = None, test_size: int | None = None, seed: int = 0,
                       record: dict | None = None, val_size: int | float | None = None,
                       ) -> tuple[DataSplit, DataSplit, DataSplit | None, list[str], dict, str | None]:
    """Decode the chosen files of a CIFAR image folder (through the decode cache).

    Subsets are chosen from the file listing (:func:`~swalab.data.folder.select_files`) before anything
    is decoded. The whole folder is cached as ``<name>-folder-v2.pt``; a subset in its own small file
    named by a hash of the chosen files, so the two never replace each other."""
    classes, files = list_image_folder(root)
    if len(classes) != spec.num_classes:
        shown = ", ".join(classes[:12]) + (", ..." if len(classes) > 12 else "")
        raise ValueError(f"{root / 'train'} has {len(classes)} class folders ({shown}) but {spec.title} has "
                         f"{spec.num_classes}: is dataset.root pointing at the right data set?")
    chosen = select_files(files, train_size, test_size, seed, val_size, classes)
    record = record or folder_record(root, SPLITS, IMAGE_EXTENSIONS, cache_dir)
    source = {"layout": "folder", "num_files": sum(len(v) for v in files.values()), "fingerprint": record["fingerprint"]}
    variant = None
    if any(chosen[split] is not files[split] for split in files):  # a subset: its own cache file
        source["chosen"] = selection_digest(chosen, root)
        variant = source["chosen"][:16]

    def decode() -> dict:
        out = {"classes": classes}
        for split in chosen:  # train, test, and val with a validation split
            decoded = decode_split(chosen[split], size=IMAGE_SIZE)
            out.update({f"{split}_images": decoded.images, f"{split}_labels": decoded.labels})
        return out

    path = cache_path(root, spec.name, "folder", cache_dir, variant) if cache else None
    got, note = cached(path, source, decode, keys=("val_images", "val_labels") if "val" in chosen else ())
    return (DataSplit(images=got["train_images"], labels=got["train_labels"]),
            DataSplit(images=got["test_images"], labels=got["test_labels"]),
            DataSplit(images=got["val_images"], labels=got["val_labels"]) if "val" in chosen else None,
            list(got["classes"]), record, note)


@records_files(files_record)
def load_cifar(name: str, root: str | Path, download: bool = True, train_size: int | None = None, seed: int = 0,
               cache: bool = True, cache_dir: str | Path | None = None, test_size: int | None = None,
               record: dict | None = None, val_size: int | float | None = None) -> ImageData:
    """Load CIFAR-10 (``name="cifar10"``) or CIFAR-100 (``"cifar100"``, fine labels) into memory.

    The layout is detected from what ``root`` holds (see the module docstring). An image folder must
    have exactly 10 or 100 class folders of 32x32 images in both ``train/`` and ``test/``.

    Args:
        name: ``"cifar10"`` or ``"cifar100"``.
        root: ``dataset.root``, the folder holding either layout.
        download: if neither layout is found, let torchvision download the pickles into ``root``.
            Leave it on for a first run on a machine with internet; turn it off on offline clusters so a
            wrong path fails at once instead of after a network timeout.
        train_size, test_size, val_size, seed, cache_dir, record: ``swalab.data``'s module doc (from an image
            folder, the chosen files give the same images a subset of the whole split would).
        cache: for the image-folder layout, keep the decoded tensors (:mod:`swalab.data.cache`: written atomically,
            decoded again when a file of the folder changed, rebuilt with a warning when stale or unreadable, skipped
            with a warning when the cache directory is not writable). The pickle layout is never cached: it already
            stores decoded pixels and reads as fast as the cache.

    Raises:
        FileNotFoundError: neither layout is present (and ``download`` is off), or a file or split is
            missing; the message names ``dataset.root``, both layouts and how to get the data.
        RuntimeError: the download failed (folders the attempt created are removed again).
        ValueError: damaged files, wrong shapes, out-of-range labels, empty class folders, a class
            count that does not match ``name``, or a ``train_size``/``test_size`` that is not an integer
            in range; the message names the file, folder or key."""
    spec = _spec(name)
    root_arg = root
    root = Path(root).expanduser().resolve()
    pickle_dir = _find_pickle_dir(root, spec)
    if pickle_dir is None and not has_image_folder(root):
        if not download:
            raise FileNotFoundError(f"No {spec.title} data found under dataset.root (and run.download is false).\n"
                                    + _layout_help(spec, root_arg, root))
        _download(root, spec, root_arg)
        pickle_dir = _find_pickle_dir(root, spec)
        if pickle_dir is None:
            raise FileNotFoundError(f"torchvision reported a finished {spec.title} download, but "
                                    f"{root / spec.pickle_dir} does not exist.\n" + _layout_help(spec, root_arg, root))
    note = None
    if pickle_dir is not None:
        train, test, classes = read_cifar_pickles(pickle_dir, name)
        train, val = split_off_val(train, val_size, classes)
        train = subset(train, train_size, seed, what=after_val("the training split", val))
        test = cap_test_split(test, test_size)
        record = record or files_record(name, root, cache_dir)
    else:
        train, test, val, classes, record, note = _load_image_folder(
            root, spec, cache, None if cache_dir is None else Path(cache_dir), train_size, test_size, seed, record,
            val_size)
    return ImageData(name=spec.name, train=train, test=test, num_classes=spec.num_classes, classes=classes,
                     channels=3, record=record, cache_note=note, val=val)
