"""A GPU-resident, airbench-style loader for small image data sets (CIFAR, digits).

A CIFAR-10 training split is 150 MB as ``uint8``, so it fits on any accelerator many times over. Moving
it there once and cropping/flipping whole batches with tensor ops removes the usual bottleneck of small
models: ``DataLoader`` workers decoding and augmenting one PIL image at a time in Python. Per batch this
loader runs a handful of kernels (one gather for crop+flip, one normalisation) and no Python per image.

Use it for data sets that fit in device memory and need only crop/flip augmentation. For ImageNet-size
data, or richer augmentation (RandAugment, mixup), use a ``torch.utils.data.DataLoader`` instead.

Reproducibility: every random choice of an epoch (order, crop offsets, flips) is drawn on the CPU from a
generator seeded by ``(seed, epoch)`` only, then moved to the device. The batches therefore do not depend
on the device, on earlier epochs, or on how many batches of the previous epoch were consumed; a run
resumed at an epoch boundary (``set_epoch(e)``) sees exactly the batches of an uninterrupted run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .splits import DataSplit, pixel_max


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator whose state depends only on ``(seed, epoch)``.

    The two numbers are mixed with numpy's ``SeedSequence`` rather than added, so that nearby pairs
    (seed 1 epoch 0 versus seed 0 epoch 1) give unrelated streams."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be non-negative integers, got seed={seed!r}, epoch={epoch!r}")
    hi, lo = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(hi) << 32) | int(lo))


def _draw_crop_flip(n: int, max_y: int, max_x: int, flip: bool,
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = generator.device if generator is not None else torch.device("cpu")
    offsets_y = torch.randint(0, max_y + 1, (n,), generator=generator, device=device)
    offsets_x = torch.randint(0, max_x + 1, (n,), generator=generator, device=device)
    if flip:
        flipped = torch.randint(0, 2, (n,), generator=generator, device=device).bool()
    else:
        flipped = torch.zeros(n, dtype=torch.bool, device=device)
    return offsets_y, offsets_x, flipped


def _gather_windows(source: torch.Tensor, index: torch.Tensor, offsets_y: torch.Tensor, offsets_x: torch.Tensor,
                    flipped: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Windows ``source[index[b], :, oy[b]:oy[b]+H, ox[b]:ox[b]+W]``, mirrored where ``flipped[b]``.

    One advanced-indexing gather does crop, flip and batch selection together: the flip reverses the
    column indices (``torch.where``) instead of moving pixels a second time."""
    h, w = size
    dev = source.device
    rows = offsets_y[:, None] + torch.arange(h, device=dev)  # [B, H]
    cols = torch.arange(w, device=dev)
    cols = offsets_x[:, None] + torch.where(flipped[:, None], (w - 1) - cols, cols)  # [B, W]
    channels = torch.arange(source.shape[1], device=dev)
    return source[index[:, None, None, None], channels[None, :, None, None], rows[:, None, :, None], cols[:, None, None, :]]


def random_crop_flip(padded: torch.Tensor, size: tuple[int, int], generator: torch.Generator | None,
                     flip: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random crop of ``size`` from each already-padded image, plus a random horizontal flip.

    With ``padded = F.pad(images, (p, p, p, p))`` this is torchvision's
    ``RandomCrop(size, padding=p, fill=0)`` followed by ``RandomHorizontalFlip()``, for a whole batch
    at once: each window's top-left corner is uniform over the ``(2p + 1)^2`` positions and each image
    is mirrored with probability 1/2.

    Args:
        padded: ``[B, C, H + 2p, W + 2p]`` images (any dtype; the loader passes ``uint8``).
        size: ``(H, W)`` of the crops.
        generator: source of randomness. Its device is where the offsets are drawn (a CPU generator
            gives the same draws whatever device ``padded`` lives on); ``None`` uses torch's global RNG.
        flip: whether to flip at random; if ``False`` no image is flipped.

    Returns:
        ``(crops, offsets_y, offsets_x, flipped)``: crops ``[B, C, H, W]``; the window corners in
        padded coordinates, each in ``[0, 2p]`` (the shift relative to the original image is
        ``offset - p``); and a bool mask of the mirrored images. All on ``padded.device``."""
    b, _, hp, wp = padded.shape
    h, w = size
    if h > hp or w > wp:
        raise ValueError(f"crop size {size} is larger than the padded images ({hp}, {wp})")
    oy, ox, fl = (t.to(padded.device) for t in _draw_crop_flip(b, hp - h, wp - w, flip, generator))
    crops = _gather_windows(padded, torch.arange(b, device=padded.device), oy, ox, fl, (h, w))
    return crops, oy, ox, fl


def check_shard(n: int, batch_size: int, train: bool, drop_last: bool | None, rank: int, world_size: int) -> None:
    """The one rule of every loader sharded by rank (this one and ``imagenet.StreamLoader``): ``rank`` within the
    world, training batches only (every rank evaluates the whole split), whole batches only, at least one global
    batch of ``batch_size x world_size`` samples."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if world_size > 1 and not train:
        raise ValueError("rank/world_size shard training batches only; every rank evaluates the whole split")
    if world_size > 1 and (drop_last is False or n < batch_size * world_size):
        raise ValueError(f"sharding over {world_size} ranks needs drop_last and at least one global batch "
                         f"({batch_size * world_size} samples), got drop_last={drop_last} and {n} samples")


class ResidentLoader:
    """Iterate over a :class:`DataSplit` held on the training device, in normalised float batches.

    ``train=True``: each epoch reshuffles, takes a random crop of the zero-padded image (padding
    ``pad``) and flips horizontally at random (``flip``), all as batched tensor ops. ``train=False``: the
    split in its stored order, unaugmented, every sample exactly once (nothing dropped), for evaluation
    and for the BatchNorm update pass after averaging.

    Call ``set_epoch(e)`` at the start of every epoch, as with ``DistributedSampler``; it is what makes
    a resumed run reproduce the uninterrupted one. If it is not called, each new iteration advances the
    epoch by one, so a forgotten call does not repeat the same shuffle every epoch.

    Yields ``(x, y)``: ``x`` of ``dtype`` ``[B, C, H, W]`` on ``device`` equal to
    ``(pixels / pixel_max - mean) / std`` (``channels_last`` if asked; ``pixel_max`` is 255 for 8-bit images and
    65535 for 16-bit ones, ``splits.pixel_max``), ``y`` ``int64`` on ``device``.

    Args:
        split: the data; it is copied to ``device`` once (the whole split must fit there).
        batch_size: images per batch.
        device: where the data, the batches and the augmentation live.
        mean, std: per-channel normalisation, in units of ``pixels / pixel_max`` (pixels in [0, 1]).
        train: augment and shuffle (training) or not (evaluation).
        pad: zero padding for the random crop (4 for 32x32 CIFAR, as in the paper).
        flip: random horizontal flips (turn off for data where mirroring changes the label, e.g. digits).
        drop_last: drop the last incomplete training batch. ``None`` drops it when the split holds at
            least two batches, so that BatchNorm never sees a tiny last batch but a tiny data set still
            yields one. Must stay off for evaluation.
        seed: with the epoch, fixes the order and augmentation.
        channels_last: return batches in ``torch.channels_last`` memory format (faster convolutions
            with AMP on recent GPUs).
        dtype: floating dtype of ``x``; the normalisation itself is computed in float32.
        rank, world_size: data-parallel training (``torchrun``): every rank draws the same seeded
            permutation and takes its own ``batch_size`` slice of each global batch of
            ``batch_size * world_size`` samples, so the ranks together see exactly the batches of one
            process with the global batch size. Training only; the last incomplete batch is dropped.
        prenormalize: normalise the whole split once, when the loader is built, and keep it on
            ``device`` as ``dtype`` (4x the memory of ``uint8`` in float32) instead of normalising every
            batch. The batches are bit-identical either way (normalisation is elementwise, so it commutes
            with the crop/flip gather); per batch it saves the uint8->float pass and two arithmetic
            passes (bench/README.md). ``None``: on for CUDA, where memory is plentiful and the loader must
            keep up with fast steps; off on CPU, where the step dominates and memory is shared."""

    def __init__(self, split: DataSplit, batch_size: int, device: torch.device | str, mean: Sequence[float],
                 std: Sequence[float], train: bool, pad: int = 4, flip: bool = True, drop_last: bool | None = None,
                 seed: int = 0, channels_last: bool = False, dtype: torch.dtype = torch.float32,
                 prenormalize: bool | None = None, rank: int = 0, world_size: int = 1) -> None:
        n = len(split)
        channels, height, width = split.images.shape[1:]
        if n == 0:
            raise ValueError("cannot build a loader over an empty split")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if pad < 0:
            raise ValueError(f"pad must be non-negative, got {pad}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if len(mean) != channels or len(std) != channels:
            raise ValueError(f"mean and std need one value per channel: the images have {channels} channel(s), "
                             f"got mean={list(mean)} and std={list(std)}")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be positive, got {list(std)}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        check_shard(n, batch_size, train, drop_last, rank, world_size)
        self.rank, self.world_size = int(rank), int(world_size)
        if drop_last is None:
            drop_last = train and n >= 2 * batch_size * world_size
        elif drop_last and not train:
            raise ValueError("drop_last=True with train=False would leave test samples out of the evaluation")
        elif drop_last and n < batch_size:
            raise ValueError(f"drop_last=True with {n} samples and batch_size={batch_size} would yield no batch")

        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.pad = int(pad)
        self.flip = bool(flip)
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        self.channels_last = bool(channels_last)
        self.dtype = dtype
        self.epoch = 0
        self._n = n
        self._size = (int(height), int(width))
        top = pixel_max(split.images)
        # 16-bit pixels travel as int32: uint16 has few kernels on accelerators (padding, gathers); values unchanged
        images = split.images if split.images.dtype == torch.uint8 else split.images.to(torch.int32)
        images = images.to(self.device)
        if self.train and self.pad > 0:
            images = F.pad(images, (self.pad,) * 4)  # once per run, not once per batch
        self._labels = split.labels.to(self.device)
        mean_t = torch.tensor(mean, dtype=torch.float32)
        std_t = torch.tensor(std, dtype=torch.float32)
        self._scale = (1.0 / (top * std_t)).view(1, -1, 1, 1).to(self.device)
        self._shift = (-mean_t / std_t).view(1, -1, 1, 1).to(self.device)
        self.prenormalized = self.device.type == "cuda" if prenormalize is None else bool(prenormalize)
        self._images = self._to_float(images) if self.prenormalized else images

    def __len__(self) -> int:
        """Number of batches per pass."""
        if self.drop_last:
            return self._n // (self.batch_size * self.world_size)
        return len(self._bounds())

    def _bounds(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each batch of one process's pass. In training a last batch of a single sample is
        folded into the batch before it: BatchNorm cannot normalise one sample in training mode (BatchNorm1d
        fails on it; a BN update would weigh one image like a whole batch), so no training pass yields one
        unless the split itself holds one image or ``batch_size`` is 1."""
        bounds = [(start, min(start + self.batch_size, self._n)) for start in range(0, self._n, self.batch_size)]
        if self.train and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
            bounds[-2:] = [(bounds[-2][0], self._n)]
        return bounds

    @property
    def num_samples(self) -> int:
        """Number of samples yielded per pass (the split size, minus the dropped last batch)."""
        return len(self) * self.batch_size if self.drop_last else self._n

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch whose shuffle and augmentation the next iteration uses."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        self.epoch = int(epoch)

    def _to_float(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.to(torch.float32).mul_(self._scale).add_(self._shift)
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def _normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        if not self.prenormalized:
            return self._to_float(pixels)
        return pixels.clone() if pixels._base is not None else pixels  # never hand out a view of the split

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        self.epoch += 1
        return self._train_batches(epoch) if self.train else self._eval_batches()

    def _eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self._n, self.batch_size):
            stop = start + self.batch_size
            yield self._normalize(self._images[start:stop]), self._labels[start:stop]

    def _train_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = epoch_generator(self.seed, epoch)
        order = torch.randperm(self._n, generator=g)
        draws = _draw_crop_flip(self._n, 2 * self.pad, 2 * self.pad, self.flip, g)
        order, oy, ox, fl = (t.to(self.device) for t in (order, *draws))  # one transfer per epoch
        if self.drop_last:  # this rank's slice of each global batch
            bounds = [((i * self.world_size + self.rank) * self.batch_size,
                       (i * self.world_size + self.rank + 1) * self.batch_size) for i in range(len(self))]
        else:
            bounds = self._bounds()
        for start, stop in bounds:
            part = slice(start, stop)
            index = order[part]
            pixels = _gather_windows(self._images, index, oy[part], ox[part], fl[part], self._size)
            yield self._normalize(pixels), self._labels[index]
