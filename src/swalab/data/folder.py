"""Reading an image-folder data set (``root/{train,test}/<class>/<image>``) into uint8 tensors.

This is the layout of the JPEG copy of CIFAR-10 and of most data sets exported by hand. Class indices
are the positions of the class folder names in sorted order, which for CIFAR-10 and CIFAR-100 is the
standard label order. Every image is decoded once with PIL to RGB or grayscale (optionally resized);
decoding tens of thousands of small files is slow (the loaders cache the result, see
:mod:`swalab.data.cache`), so decoding runs in a small thread pool (PIL releases the GIL while it
decodes), and a loader that needs only a subset chooses its files first (:func:`select_files`, from
the listing alone) and decodes only those."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageMode

from .fingerprint import _class_folders, _files  # the one listing of class folders and their files
from .splits import TEST_SUBSET_SEED, DataSplit, hold_out, subset_indices

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "test")


def has_image_folder(root: Path) -> bool:
    """Whether ``root`` looks like an image folder (holds ``train/`` or ``test/``)."""
    return any((root / s).is_dir() for s in SPLITS)


def list_image_folder(root: Path, max_per_class: int | None = None) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """List the classes and the ``(file path, label)`` pairs of both splits, checking the layout.

    Paths are plain strings (``root/split/class/name``): for 60,000 files, ``pathlib`` objects would
    make listing and fingerprinting a cached data set several times slower than reading its cache.

    Raises ``FileNotFoundError`` when ``root`` or a split is missing and ``ValueError`` when a class
    folder is empty or the two splits have different class folders; each message names the folder."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist or is not a folder: set dataset.root=DIR to the "
                                f"folder holding train/<class>/* and test/<class>/*")
    missing = [s for s in SPLITS if not (root / s).is_dir()]
    if missing:
        present = [s for s in SPLITS if s not in missing]
        raise FileNotFoundError(f"image folder {root} has {', '.join(f'{s}/' for s in present) or 'no split folders'} "
                                f"but no {' or '.join(f'{s}/' for s in missing)}: the image-folder layout needs both "
                                f"{root / 'train'}/<class>/* and {root / 'test'}/<class>/*")
    classes = _class_folders(root / "train")
    if not classes:
        raise ValueError(f"{root / 'train'} holds no class folders; expected {root / 'train'}/<class>/<image>")
    test_classes = _class_folders(root / "test")
    if test_classes != classes:
        only_train = sorted(set(classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(classes))
        raise ValueError(f"train/ and test/ under {root} have different class folders: "
                         f"only in train/: {only_train or 'none'}; only in test/: {only_test or 'none'}")
    files: dict[str, list[tuple[str, int]]] = {}
    for split in SPLITS:
        pairs = []
        for label, name in enumerate(classes):
            class_dir = root / split / name
            names = [e.name for e in _files(class_dir, IMAGE_EXTENSIONS)]
            if not names:
                raise ValueError(f"class folder {class_dir} is empty: it holds no image files "
                                 f"({', '.join(IMAGE_EXTENSIONS)})")
            if max_per_class is not None:
                names = names[:max_per_class]
            prefix = os.path.join(class_dir, "")
            pairs.extend((prefix + n, label) for n in names)
        files[split] = pairs
    return classes, files


def select_files(files: dict[str, list[tuple[str, int]]], train_size: int | None, test_size: int | None, seed: int,
                 val_size: int | float | None = None,
                 classes: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
    """The files a load decodes: ``train_size`` of the training files and ``test_size`` of the test files, and
    with ``val_size`` a validation split (key ``val``) held out of the training files first.

    The same class-stratified, nested subsets :func:`swalab.data.subset` takes from decoded splits,
    chosen from the labels of the listing alone, so a loader decodes only the images it keeps
    (``train_size=500`` decodes 500 images, not 50,000) and gets exactly the images, in the same order,
    that decoding everything and then subsetting would give. The validation split is
    :func:`~swalab.data.splits.hold_out`'s (the same for every seed); the training subset is then drawn from
    the files left, seeded by ``seed``; the test subset always by :data:`~swalab.data.splits.TEST_SUBSET_SEED`, so
    every run seed is scored on the same test images. ``None`` keeps a split whole (the same list is returned).
    ``classes`` name the classes in errors."""
    chosen = {}
    train = files["train"]
    held = hold_out(torch.tensor([y for _, y in train], dtype=torch.int64), val_size, classes)
    what = "the training split"
    if held is not None:
        chosen["val"] = [train[i] for i in held[1].tolist()]
        train = [train[i] for i in held[0].tolist()]
        what += f" less the {len(chosen['val'])} validation images (dataset.val_size)"
    for split, pairs, size, split_seed, key, split_what in (
        ("train", train, train_size, seed, "dataset.train_size", what),
        ("test", files["test"], test_size, TEST_SUBSET_SEED, "dataset.test_size", "the test split"),
    ):
        labels = torch.tensor([y for _, y in pairs], dtype=torch.int64)
        keep = subset_indices(labels, size, split_seed, key, split_what)
        chosen[split] = pairs if keep is None else [pairs[i] for i in keep.tolist()]
    return chosen


def selection_digest(files: dict[str, list[tuple[str, int]]], root: Path) -> str:
    """A hash of which files (paths relative to ``root``) and labels each split holds, in order.

    Part of a subset's cache key: two loads share a cache file only if they decode the same files."""
    skip = len(os.path.join(root, ""))
    splits = [s for s in (*SPLITS, "val") if s in files]  # without a validation split, the digest of earlier versions
    text = "".join(f"{split}\0{path[skip:]}\0{label}\n" for split in splits for path, label in files[split])
    return hashlib.sha256(text.encode()).hexdigest()


def single_channel(mode: str) -> bool:
    """Whether PIL image ``mode`` holds one grey band, alpha aside.

    True for ``1``, ``L``, ``LA``, ``La``, ``I``, ``I;16``..., ``F``. Palette images (``P``, ``PA``) count
    as colour, since a palette may hold colours; every other mode (``RGB``, ``RGBA``, ``CMYK``...) too."""
    bands = ImageMode.getmode(mode).bands
    if len(bands) > 1 and bands[-1] in ("A", "a"):
        bands = bands[:-1]
    return len(bands) == 1 and bands[0] != "P"


def _image_mode(path: str) -> str:
    """The PIL mode of ``path``, read from its header only (no pixels are decoded)."""
    try:
        with Image.open(path) as im:
            return im.mode
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError or DecompressionBombError
        raise ValueError(f"cannot decode image {path}: {type(err).__name__}: {err}") from err


def infer_channels(paths: list[str]) -> int:
    """1 if every image in ``paths`` is single-channel (:func:`single_channel`), else 3.

    Reads file headers only, and stops at the first colour image, so on a colour data set it costs one
    header read; only an all-grey folder has every header read."""
    chunk = 1024
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for start in range(0, len(paths), chunk):
            if not all(single_channel(m) for m in pool.map(_image_mode, paths[start : start + chunk])):
                return 3
    return 1


def _deep_grey(im: Image.Image) -> np.ndarray | None:
    """The pixels of a grey image deeper than 8 bits as a ``uint16`` array ``[H, W]``, at their full depth; None for
    every other image (left to PIL's ``convert``, which would clip 16-bit values to 0 or 255).

    16-bit grey images (PIL modes ``I;16*``) are deep. A 32-bit integer image (mode ``I``) is deep when its values
    exceed 255 and read as 8-bit when they fit 0..255; values outside 0..65535 are refused."""
    if not (im.mode.startswith("I;16") or im.mode == "I"):
        return None
    values = np.asarray(im)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError(f"a {im.mode} image with values in [{values.min()}, {values.max()}]: swalab reads grey "
                         "images of up to 16 bits (0..65535)")
    if im.mode == "I" and (not values.size or values.max() <= 255):
        return None
    return values.astype(np.uint16)


def _resize_deep(values: np.ndarray, resize: int) -> np.ndarray:
    """A ``uint16`` grey image scaled to ``resize`` x ``resize`` with PIL's bilinear filter, in floating point (PIL
    resizes 32-bit float images, not 16-bit integer ones), rounded back to 16 bits."""
    scaled = Image.fromarray(values.astype(np.float32), mode="F").resize((resize, resize), Image.Resampling.BILINEAR)
    return np.clip(np.rint(np.asarray(scaled)), 0, 65535).astype(np.uint16)


def _decode_image(path: str | Path, mode: str = "RGB", resize: int | None = None) -> np.ndarray:
    """Decode one file to a ``uint8`` array ``[H, W, C]`` (``uint16`` for a 16-bit grey image, read at its full
    depth: :func:`_deep_grey`), naming the file if it cannot be read.

    ``mode`` is the PIL mode converted to: ``"RGB"`` (C = 3; alpha dropped, grey replicated) or ``"L"``
    (C = 1; colour becomes luma, ``L = 0.299 R + 0.587 G + 0.114 B``). ``resize``: scale to ``resize`` x ``resize``
    pixels with PIL's bilinear filter (antialiased when shrinking; the aspect ratio is not kept)."""
    try:
        with Image.open(path) as im:
            deep = _deep_grey(im)
            if deep is not None:
                if resize is not None and deep.shape != (resize, resize):
                    deep = _resize_deep(deep, resize)
                return np.repeat(deep[:, :, None], 3 if mode == "RGB" else 1, axis=2)
            if im.mode == "I":  # 32-bit integers that fit 8 bits (_deep_grey): grey, exactly
                im = Image.fromarray(np.asarray(im).astype(np.uint8), mode="L")
            converted = im.convert(mode)
            if resize is not None and converted.size != (resize, resize):
                converted = converted.resize((resize, resize), Image.Resampling.BILINEAR)
            arr = np.asarray(converted)
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError or DecompressionBombError
        raise ValueError(f"cannot decode image {path}: {type(err).__name__}: {err}") from err
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_images(paths: list[str] | list[Path], size: tuple[int, int] | None = None,
                  mode: str = "RGB", resize: int | None = None, hint: str = "") -> torch.Tensor:
    """Decode ``paths`` into one ``uint8`` tensor ``[N, C, H, W]`` (C = 3 for ``mode="RGB"``, 1 for ``"L"``).

    When any image is a 16-bit grey one, the tensor is ``uint16`` and holds every image at 16 bits: the 8-bit
    ones scaled by 257 (255 -> 65535, exact), so that no image loses depth and all share one full scale.

    With ``resize`` every image is scaled to ``resize`` x ``resize`` (see :func:`_decode_image`).
    Otherwise all images must have the same size (``size`` if given, else that of the first image); a
    file of another size raises ``ValueError`` naming it (and the first file, whose size it differs
    from), followed by ``hint``: nothing is resized unless asked, since that would change the data."""
    if not paths:
        raise ValueError("no images to decode")
    first = _decode_image(paths[0], mode, resize)
    expected = size if size is not None else first.shape[:2]
    out = np.empty((len(paths), expected[0], expected[1], first.shape[2]), dtype=first.dtype)

    def put(i: int, arr: np.ndarray) -> None:
        nonlocal out
        if arr.shape[:2] != tuple(expected):
            than = f"expected {expected[1]}x{expected[0]}" if size is not None else (
                f"{paths[0]} is {expected[1]}x{expected[0]}")
            raise ValueError(f"image {paths[i]} is {arr.shape[1]}x{arr.shape[0]} (WxH) but {than}: all images of a "
                             f"data set must have the same size{hint}")
        if arr.dtype == np.uint16 and out.dtype == np.uint8:  # the first deep image: all so far go to 16 bits
            out = out.astype(np.uint16) * 257  # (the rows not decoded yet are overwritten below)
        out[i] = arr.astype(np.uint16) * 257 if out.dtype == np.uint16 and arr.dtype == np.uint8 else arr

    put(0, first)
    chunk = 1024
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for start in range(1, len(paths), chunk):
            batch = paths[start : start + chunk]
            # looked up at each call (not bound once), so a test can count or forbid decodes by patching it
            for j, arr in enumerate(pool.map(lambda p: _decode_image(p, mode, resize), batch)):
                put(start + j, arr)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def decode_split(pairs: list[tuple[str, int]], size: tuple[int, int] | None = None) -> DataSplit:
    """Decode the ``(file, label)`` pairs listed by :func:`list_image_folder` into a :class:`DataSplit`."""
    images = decode_images([p for p, _ in pairs], size=size)
    labels = torch.tensor([y for _, y in pairs], dtype=torch.int64)
    return DataSplit(images=images, labels=labels)


def read_image_folder(root: str | Path, max_per_class: int | None = None,
                      size: tuple[int, int] | None = None) -> tuple[DataSplit, DataSplit, list[str]]:
    """Decode ``root/train/<class>/*`` and ``root/test/<class>/*`` into two splits, without caching.

    Class folders are sorted by name and numbered from 0; files inside a class are taken in sorted
    order. Hidden entries (``.name``) and files without an image extension are ignored. For CIFAR use
    :func:`swalab.data.cifar.load_cifar`, which checks the class count and caches the decoded pixels.

    Args:
        root: folder holding ``train/`` and ``test/``.
        max_per_class: if set, only the first ``max_per_class`` files (sorted by name) of each class
            folder in each split are read. For tests and quick looks at a large folder; it is not a
            random sample (use :func:`swalab.data.subset` / ``dataset.train_size`` for real subsets).
        size: required ``(H, W)`` of every image; ``None`` requires only that all sizes agree.

    Returns:
        ``(train, test, classes)``."""
    if max_per_class is not None and (isinstance(max_per_class, bool) or max_per_class < 1):
        raise ValueError(f"max_per_class must be a positive integer or None, got {max_per_class!r}")
    classes, files = list_image_folder(Path(root), max_per_class)
    train = decode_split(files["train"], size=size)
    test = decode_split(files["test"], size=tuple(train.images.shape[-2:]))  # must match the train images
    return train, test, classes
