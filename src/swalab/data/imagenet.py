"""ImageNet-1k from an image folder, streamed from disk through ``DataLoader`` worker processes.

Layout: ``root/train/<wnid>/*`` and ``root/val/<wnid>/*``, the folder names being ImageNet-1k WordNet
ids (``n01440764`` ...). Labels are the *ImageNet-1k indices* of those ids (their position in the sorted
list of the 1000 wnids, timm's ``ImageNetInfo``), not positions among the folders present: a folder
holding only some classes (e.g. the 10 of imagenette) is still scored against a pretrained 1000-way head.

ImageNet does not fit in device memory, so unlike CIFAR (:class:`~swalab.data.loader.ResidentLoader`)
images are decoded and augmented per item on the CPU. Transforms come from the model's pretrained
config (timm's ``resolve_data_config`` / ``create_transform``): evaluation is resize + centre crop with
the interpolation, ``crop_pct`` and mean/std the weights were trained with; training is the standard
``RandomResizedCrop`` + horizontal flip (no colour jitter, as in the torchvision recipe the paper's
models were trained with).

Reproducibility: :class:`SeededSampler` draws the order of an epoch and one seed per item from
``(seed, epoch)`` only, and the item's random crop and flip are drawn from that seed, so the batches
of an epoch do not depend on the worker count, on worker processes surviving between epochs, or on
earlier epochs. A run resumed at an epoch boundary therefore sees the same images and crops.

Data-parallel training follows the rule of the resident loader (``swalab.distributed``): every rank draws the
same permutation and item seeds from ``(seed, epoch)`` and takes its own ``batch_size`` slice of every global
batch of ``batch_size * world_size`` items, so the ranks together decode and train on exactly the batches of
one process, each item once, with the same crops."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from .fingerprint import _class_folders, _files, records_files
from .folder import IMAGE_EXTENSIONS
from .loader import check_shard, epoch_generator
from .splits import TEST_SUBSET_SEED, check_size, hold_out, subset_indices

TRAIN_SPLIT, EVAL_SPLIT = "train", "val"
NUM_CLASSES = 1000


@lru_cache(maxsize=1)
def imagenet_wnid_index() -> dict[str, int]:
    """``{wnid: ImageNet-1k index}`` for the 1000 classes (sorted-wnid order, as every ImageNet-1k head uses)."""
    from timm.data import ImageNetInfo

    return {wnid: i for i, wnid in enumerate(ImageNetInfo().label_names())}


def list_imagenet_split(split_dir: str | Path) -> list[tuple[str, int]]:
    """The ``(file, ImageNet-1k label)`` pairs of one split folder, sorted by class folder then file.

    Raises ``FileNotFoundError`` for a missing split and ``ValueError`` for a class folder whose name
    is not an ImageNet-1k wnid, a class folder without images, or a split without any images; each
    message names the folder concerned."""
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise FileNotFoundError(f"{split_dir} does not exist: an ImageNet folder holds train/<wnid>/* and "
                                f"val/<wnid>/* (wnids like n01440764)")
    index = imagenet_wnid_index()
    folders = _class_folders(split_dir)
    unknown = [f for f in folders if f not in index]
    if unknown:
        raise ValueError(f"{split_dir} has class folders that are not ImageNet-1k wnids: {unknown[:10]}"
                         f"{' ...' if len(unknown) > 10 else ''}; every folder must be named by its wnid "
                         "(e.g. n01440764) so that labels match the 1000-way head")
    pairs: list[tuple[str, int]] = []
    for wnid in folders:
        class_dir = split_dir / wnid
        names = [e.name for e in _files(class_dir, IMAGE_EXTENSIONS)]
        if not names:
            raise ValueError(f"class folder {class_dir} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
        prefix = os.path.join(class_dir, "")
        pairs.extend((prefix + n, index[wnid]) for n in names)
    if not pairs:
        raise ValueError(f"{split_dir} holds no images: expected {split_dir}/<wnid>/<image>")
    return pairs


class ImageFolderSplit(Dataset):
    """A list of ``(file, label)`` pairs read on demand, with an optional transform (set by the loader).

    Items are addressed by index, or by ``(index, seed)`` as :class:`SeededSampler` yields them: the
    seed then fixes every random choice the transform makes (Python's ``random`` and torch's CPU RNG,
    which timm's and torchvision's transforms use), without disturbing the caller's RNG state."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform=None):
        self.samples = list(samples)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> torch.Tensor:
        return torch.tensor([y for _, y in self.samples], dtype=torch.int64)

    def with_transform(self, transform) -> "ImageFolderSplit":
        return ImageFolderSplit(self.samples, transform)

    def subset(self, indices: Sequence[int]) -> "ImageFolderSplit":
        return ImageFolderSplit([self.samples[i] for i in indices], self.transform)

    def _load(self, i: int):
        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                image = im.convert("RGB")
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError or DecompressionBombError
            raise ValueError(f"cannot decode image {path}: {type(err).__name__}: {err}") from err
        return image, label

    def __getitem__(self, key):
        if isinstance(key, tuple):
            i, seed = key
            image, label = self._load(i)
            if self.transform is None:
                return image, label
            state = random.getstate()
            with torch.random.fork_rng(devices=[]):
                random.seed(seed)
                torch.manual_seed(seed)
                try:
                    return self.transform(image), label
                finally:
                    random.setstate(state)
        image, label = self._load(key)
        return (image if self.transform is None else self.transform(image)), label


@dataclass
class FolderData:
    """What :func:`load_imagenet` returns: the two listed splits (no pixels decoded yet)."""

    name: str
    train: ImageFolderSplit
    test: ImageFolderSplit
    num_classes: int
    classes: list[str]
    record: dict | None = None        # the files read (swalab.data.fingerprint)
    cache_note: str | None = None     # nothing is cached: images are decoded from disk every epoch
    val: ImageFolderSplit | None = None  # held out of train/ (dataset.val_size): train holds none of its images


def files_record(root: str | Path, cache_dir: str | Path | None = None, **_) -> dict:
    """The record of the files :func:`load_imagenet` reads (``swalab.data.fingerprint``); the first time a
    1.28M-image folder is read whole, later starts only ``stat`` the files."""
    from .fingerprint import folder_record

    return folder_record(root, (TRAIN_SPLIT, EVAL_SPLIT), IMAGE_EXTENSIONS, cache_dir)


@records_files(files_record)
def load_imagenet(root: str | Path, train_size: int | None = None, seed: int = 0,
                  test_size: int | None = None, cache_dir: str | Path | None = None,
                  record: dict | None = None, val_size: int | float | None = None) -> FolderData:
    """List ``root/train`` and ``root/val`` (see the module docstring); decode nothing yet.

    The caps: ``swalab.data``'s module doc, but ``train_size`` keeps a plain random subset (chosen by ``seed``)
    and both subsets stay in folder order; the ImageNet ``val/`` folder is the test split (``test_size``), and
    ``val_size`` is held out of ``train/``. ``cache_dir`` caches the files' digests."""
    root = Path(root)
    train = list_imagenet_split(root / TRAIN_SPLIT)
    test = list_imagenet_split(root / EVAL_SPLIT)
    held = hold_out(torch.tensor([y for _, y in train], dtype=torch.int64), val_size)
    val = None
    where = f"{root / TRAIN_SPLIT}"
    if held is not None:
        val = [train[i] for i in held[1].tolist()]
        train = [train[i] for i in held[0].tolist()]
        where += f" less the {len(val)} validation images (dataset.val_size)"
    size = check_size(train_size, "dataset.train_size", len(train), where)
    if size is not None:
        keep = torch.randperm(len(train), generator=epoch_generator(seed, 0))[:size].sort().values
        train = [train[i] for i in keep.tolist()]
    keep = subset_indices(torch.tensor([y for _, y in test], dtype=torch.int64), test_size, TEST_SUBSET_SEED,
                          "dataset.test_size", f"{root / EVAL_SPLIT}")
    if keep is not None:
        test = [test[i] for i in keep.tolist()]
    from timm.data import ImageNetInfo

    return FolderData(name="imagenet", train=ImageFolderSplit(train), test=ImageFolderSplit(test),
                      num_classes=NUM_CLASSES, classes=list(ImageNetInfo().label_names()),
                      record=record or files_record(root, cache_dir),
                      val=ImageFolderSplit(val) if val is not None else None)


def imagenet_transforms(model_name: str | None, image_size: int | None = None, mean: Sequence[float] | None = None,
                        std: Sequence[float] | None = None, interpolation: str | None = None,
                        crop_pct: float | None = None, flip: bool = True) -> tuple[object, object, dict]:
    """``(train transform, eval transform, data config)`` for a timm model's pretrained weights.

    Values left ``None`` come from ``model_name``'s pretrained config (timm's defaults when the name is
    ``None`` or has none): input size, interpolation, ``crop_pct``, mean and std. ``image_size`` sets
    both the training crop and the evaluation crop (the resize before the centre crop is
    ``image_size / crop_pct``), e.g. 128 for quick CPU runs. ``flip``: random horizontal flips in training."""
    from timm.data import create_transform, resolve_data_config
    from timm.models import get_pretrained_cfg

    pretrained_cfg = None
    if model_name:
        found = get_pretrained_cfg(model_name)
        pretrained_cfg = found.to_dict() if found is not None else None
    args = {}
    if image_size is not None:
        args["input_size"] = (3, int(image_size), int(image_size))
    for key, value in (("mean", mean), ("std", std), ("interpolation", interpolation), ("crop_pct", crop_pct)):
        if value is not None:
            args[key] = tuple(value) if key in ("mean", "std") else value
    config = resolve_data_config(args, pretrained_cfg=pretrained_cfg)
    train = create_transform(**config, is_training=True, color_jitter=None, hflip=0.5 if flip else 0.0)
    test = create_transform(**config, is_training=False)
    return train, test, config


class SeededSampler(Sampler):
    """Yields ``(index, item seed)`` pairs over ``n`` items; the order and seeds depend on ``(seed, epoch)``.

    ``shuffle=False`` keeps the stored order (evaluation). ``set_epoch(e)`` chooses the epoch the next
    pass uses, as with ``DistributedSampler``; a pass without it advances the epoch by one. With ``world_size > 1``
    it yields only ``rank``'s slices: of every run of ``batch_size * world_size`` items of the pass, the
    ``batch_size`` items from position ``rank * batch_size`` (a last incomplete global batch is dropped)."""

    def __init__(self, n: int, seed: int, shuffle: bool, batch_size: int = 1, rank: int = 0, world_size: int = 1):
        self.n, self.seed, self.shuffle, self.epoch = int(n), int(seed), bool(shuffle), 0
        self.batch_size, self.rank, self.world_size = int(batch_size), int(rank), int(world_size)

    def __len__(self) -> int:
        if self.world_size == 1:
            return self.n
        return self.n // (self.batch_size * self.world_size) * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        g = epoch_generator(self.seed, self.epoch)
        self.epoch += 1
        order = torch.randperm(self.n, generator=g) if self.shuffle else torch.arange(self.n)
        seeds = torch.randint(0, 2**62, (self.n,), generator=g)
        if self.world_size > 1:  # this rank's slice of each global batch, with the seeds those items have in one process
            b, w = self.batch_size, self.world_size
            mine = torch.arange(len(self)).view(-1, b) // b  # global batch i of this rank, per item
            mine = (mine * w + self.rank) * b + torch.arange(b)
            order, seeds = order[mine.reshape(-1)], seeds[mine.reshape(-1)]
        return iter(zip(order.tolist(), seeds.tolist()))


class StreamLoader:
    """A ``DataLoader`` over an :class:`ImageFolderSplit`, with ``set_epoch`` and the labels known up front.

    Yields ``(x, y)`` CPU batches (pinned when ``pin_memory``); the trainer moves them to its device.
    ``labels`` (every label in iteration order, for evaluation loaders) lets the evaluators skip a
    decoding pass just to collect them. Worker processes stay alive between passes when
    ``persistent_workers`` (the default with workers), so an epoch does not pay their start-up again.

    ``rank, world_size``: data-parallel training; ``batch_size`` is then this rank's share of the global batch
    (module doc: the ranks' batches together are one process's, item for item). Training only."""

    def __init__(self, split: ImageFolderSplit, batch_size: int, train: bool, seed: int = 0, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = True, drop_last: bool | None = None,
                 prefetch_factor: int | None = None, rank: int = 0, world_size: int = 1):
        n = len(split)
        if n == 0:
            raise ValueError("cannot build a loader over an empty split")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        check_shard(n, batch_size, train, drop_last, rank, world_size)
        if world_size > 1:
            drop_last = True  # the sampler yields whole batches of this rank only
        elif drop_last is None:  # in training, never a tiny last batch, and never one of a single image (BatchNorm)
            drop_last = train and (n >= 2 * batch_size or (n > batch_size and n % batch_size == 1))
        self.train = bool(train)
        self.sampler = SeededSampler(n, seed, shuffle=train, batch_size=batch_size, rank=rank, world_size=world_size)
        self._order_labels = None if train else split.labels
        extra = {}
        if num_workers > 0:
            extra["persistent_workers"] = bool(persistent_workers)
            if prefetch_factor is not None:
                extra["prefetch_factor"] = int(prefetch_factor)
        # its own generator: the DataLoader draws worker base seeds from it, never from torch's global RNG
        self.loader = DataLoader(split, batch_size=int(batch_size), sampler=self.sampler, num_workers=int(num_workers),
                                 pin_memory=bool(pin_memory), drop_last=bool(drop_last),
                                 generator=torch.Generator().manual_seed(int(seed)), **extra)

    @property
    def labels(self) -> torch.Tensor | None:
        """All labels in the order batches yield them (evaluation loaders only; ``None`` when shuffled)."""
        return self._order_labels

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def num_samples(self) -> int:
        n = len(self.sampler)
        return len(self) * self.loader.batch_size if self.loader.drop_last else n

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self.loader)


def bn_subset_indices(n: int, fraction: float, minimum: int, seed: int) -> list[int] | None:
    """A fixed seeded subset of ``round(fraction * n)`` (at least ``minimum``) of ``range(n)``, or ``None`` for all."""
    if fraction >= 1:
        return None
    size = min(n, max(int(minimum), int(math.ceil(fraction * n))))
    return torch.randperm(n, generator=epoch_generator(seed, 0))[:size].sort().values.tolist()
