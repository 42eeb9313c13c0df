"""CIFAR-10-C-style corrupted copies of any test split, made here, seeded, cached and fingerprinted.

When and why: a finished run is scored under shift (``python -m swalab.results.score <run> --data
cifar10c:<corruption>:<severity>``, docs/shift.md) on its own test images corrupted the way Hendrycks & Dietterich
(ICLR 2019) made CIFAR-10-C: the 15 standard corruptions at 5 severities, with the parameters of the published 32x32
generator (``make_cifar_c.py`` of hendrycks/robustness, ``PARAMETERS_32`` below, copied value for value). PyPI's
``imagecorruptions`` was checked and is not used: its functions hold the ImageNet-C (224x224) parameters inside them
(gaussian noise 0.08 .. 0.38 where CIFAR-10-C has 0.04 .. 0.10) and take no parameters, and it needs OpenCV and
scikit-image, which swalab does not; the functions below follow the published ones with numpy, scipy and Pillow.

Five corruptions need what is not written here yet (``NOT_MADE``: glass blur's per-pixel shuffle, ImageMagick's motion
blur for motion blur and snow, the frost photographs, OpenCV's affine warp for elastic); asking for one says so.

A corrupted split is a function of the test images, the corruption, the severity and the seed (``SEED`` unless
given): it is cached in the cache directory (``swalab.data.cache``; ``run.cache_dir`` moves it) under a name of
those four, and carries a fingerprint (sha256 of its pixels) that the scores record.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from swalab.data.cache import cache_root, save_cache
from swalab.data.splits import DataSplit

SEED = 0
SEVERITIES = (1, 2, 3, 4, 5)
# The published CIFAR-10-C (32x32) parameters per corruption and severity 1..5 (hendrycks/robustness,
# ImageNet-C/create_c/make_cifar_c.py), in its order.
PARAMETERS_32 = {
    "gaussian_noise": [0.04, 0.06, .08, .09, .10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [.01, .02, .03, .05, .07],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    "zoom_blur": [np.arange(1, 1.06, 0.01), np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01),
                  np.arange(1, 1.21, 0.01), np.arange(1, 1.26, 0.01)],
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
    "fog": [(.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
    "brightness": [.05, .1, .15, .2, .3],
    "contrast": [.75, .5, .4, .3, 0.15],
    "elastic_transform": [(32 * 0, 32 * 0, 32 * 0.08), (32 * 0.05, 32 * 0.2, 32 * 0.07),
                          (32 * 0.08, 32 * 0.06, 32 * 0.06), (32 * 0.1, 32 * 0.04, 32 * 0.05),
                          (32 * 0.1, 32 * 0.03, 32 * 0.03)],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    "jpeg_compression": [80, 65, 58, 50, 40],
}
CORRUPTIONS = tuple(PARAMETERS_32)
NOT_MADE = {"glass_blur": "its per-pixel shuffle", "motion_blur": "ImageMagick's motion blur",
            "snow": "ImageMagick's motion blur", "frost": "the frost photographs",
            "elastic_transform": "OpenCV's affine warp"}
FORMAT = 1  # bump when a corruption's output changes: cached copies of the old one are then rebuilt


class CorruptionError(ValueError):
    """A corruption or severity that cannot be made: one line naming the value and what can."""


# -- the corruptions: x is one image, float64 [H, W, C] in [0, 1]; rng the image's own generator -----------------
def gaussian_noise(x, c, rng):
    return x + rng.normal(size=x.shape, scale=c)


def shot_noise(x, c, rng):
    return rng.poisson(x * c) / c


def impulse_noise(x, c, rng):
    """Salt and pepper on a fraction ``c`` of the values, half each (scikit-image's ``random_noise(mode='s&p')``)."""
    hit, salt = rng.random(x.shape) < c, rng.random(x.shape) < 0.5
    return np.where(hit, salt.astype(x.dtype), x)


def disk(radius: float, alias_blur: float) -> np.ndarray:
    """The reference's defocus kernel: a disk on a 17x17 grid, normalised, smoothed by a 3x3 Gaussian."""
    grid = np.arange(-8, 9) if radius <= 8 else np.arange(-radius, radius + 1)
    xx, yy = np.meshgrid(grid, grid)
    kernel = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float64)
    kernel /= kernel.sum()
    return ndimage.gaussian_filter(kernel, sigma=alias_blur, mode="mirror", truncate=1 / alias_blur)


def defocus_blur(x, c, rng):
    kernel = disk(*c)
    return np.stack([ndimage.correlate(x[..., d], kernel, mode="mirror") for d in range(x.shape[-1])], axis=-1)


def clipped_zoom(img: np.ndarray, factor: float) -> np.ndarray:
    """The centre of ``img`` zoomed by ``factor`` (bilinear) and cut back to its size, as the reference does."""
    h = img.shape[0]
    ch = int(np.ceil(h / factor))
    top = (h - ch) // 2
    zoomed = ndimage.zoom(img[top:top + ch, top:top + ch], (factor, factor, 1), order=1)
    trim = (zoomed.shape[0] - h) // 2
    return zoomed[trim:trim + h, trim:trim + h]


def zoom_blur(x, c, rng):
    out = np.zeros_like(x)
    for factor in c:
        out += clipped_zoom(x, factor)
    return (x + out) / (len(c) + 1)


def plasma_fractal(rng, mapsize: int = 256, wibbledecay: float = 3) -> np.ndarray:
    """A square of side ``mapsize`` of diamond-square noise in [0, 1] (the reference's fog layer)."""
    maparray = np.zeros((mapsize, mapsize))
    stepsize, wibble = mapsize, 100.0

    def wibbledmean(array):
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[stepsize // 2:mapsize:stepsize, stepsize // 2:mapsize:stepsize] = wibbledmean(squareaccum)
        drgrid = maparray[stepsize // 2:mapsize:stepsize, stepsize // 2:mapsize:stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, stepsize // 2:mapsize:stepsize] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[stepsize // 2:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def fog(x, c, rng):
    h, w = x.shape[:2]
    max_val = x.max()
    x = x + c[0] * plasma_fractal(rng, wibbledecay=c[1])[:h, :w][..., None]
    return x * max_val / (max_val + c[0])


def brightness(x, c, rng):
    """HSV value + ``c``: hue and saturation kept, so every channel scales by V'/V (grey where V = 0)."""
    value = x.max(axis=-1, keepdims=True)
    lifted = np.clip(value + c, 0, 1)
    return np.where(value > 0, x * lifted / np.where(value > 0, value, 1), lifted)


def contrast(x, c, rng):
    means = x.mean(axis=(0, 1), keepdims=True)
    return (x - means) * c + means


def _pil(x: np.ndarray) -> Image.Image:
    pixels = np.uint8(np.clip(x, 0, 1) * 255)
    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)


def _array(image: Image.Image, channels: int) -> np.ndarray:
    a = np.asarray(image, dtype=np.float64) / 255
    return a[..., None] if a.ndim == 2 else a[..., :channels]


def pixelate(x, c, rng):
    h, w = x.shape[:2]
    small = _pil(x).resize((int(w * c), int(h * c)), Image.BOX)
    return _array(small.resize((w, h), Image.BOX), x.shape[-1])


def jpeg_compression(x, c, rng):
    buffer = io.BytesIO()
    _pil(x).save(buffer, "JPEG", quality=c)
    return _array(Image.open(buffer), x.shape[-1])


MADE: dict[str, Callable] = {f.__name__: f for f in (gaussian_noise, shot_noise, impulse_noise, defocus_blur, zoom_blur,
                                                       fog, brightness, contrast, pixelate, jpeg_compression)}


# -- a corrupted split -------------------------------------------------------------------------------------------------
def check(corruption: str, severity: int) -> None:
    """Refuse, before anything is computed, a corruption or severity that cannot be made here."""
    if corruption not in PARAMETERS_32:
        raise CorruptionError(f"corruption {corruption!r} is not one of CIFAR-10-C's 15: {', '.join(CORRUPTIONS)}")
    if corruption in NOT_MADE:
        raise CorruptionError(f"corruption {corruption!r} needs {NOT_MADE[corruption]}, which swalab does not make yet; "
                              f"made here: {', '.join(MADE)}")
    if severity not in SEVERITIES:
        raise CorruptionError(f"severity {severity!r} of {corruption}: give 1 to 5")


def fingerprint(images: torch.Tensor, labels: torch.Tensor | None = None) -> str:
    """The sha256 of a split's pixels (and labels): what a corrupted set is made from, and what it is."""
    digest = hashlib.sha256(images.contiguous().numpy().tobytes())
    if labels is not None:
        digest.update(labels.numpy().tobytes())
    return digest.hexdigest()


def corrupt_images(images: torch.Tensor, corruption: str, severity: int, seed: int = SEED) -> torch.Tensor:
    """``images`` (uint8 [N, C, H, W]) corrupted by ``corruption`` at ``severity``: image i draws from its own
    generator seeded by (seed, severity, i), so a subset or another order of the images corrupts each alike."""
    check(corruption, severity)
    fn, c = MADE[corruption], PARAMETERS_32[corruption][severity - 1]
    out = np.empty(tuple(images.shape), dtype=np.uint8)
    for i, image in enumerate(images.permute(0, 2, 3, 1).numpy()):
        rng = np.random.default_rng([seed, CORRUPTIONS.index(corruption), severity, i])
        out[i] = np.uint8(np.clip(fn(image.astype(np.float64) / 255, c, rng), 0, 1) * 255).transpose(2, 0, 1)
    return torch.from_numpy(out)


def corrupted_split(split: DataSplit, corruption: str, severity: int, seed: int = SEED,
                    cache_dir: str | Path | None = None) -> tuple[DataSplit, str]:
    """``split`` with its images corrupted (:func:`corrupt_images`), read from the cache when made before; and the
    fingerprint of the corrupted pixels."""
    check(corruption, severity)
    if split.images.dtype != torch.uint8:
        raise CorruptionError(f"corruption {corruption!r} is made from 8-bit images; this test split holds "
                              f"{split.images.dtype}")
    made_from = fingerprint(split.images, split.labels)
    source = {"test": made_from, "corruption": corruption, "severity": severity, "seed": seed, "format": FORMAT}
    path = cache_root(cache_dir) / f"corrupted-{corruption}-{severity}-seed{seed}-{made_from[:16]}-f{FORMAT}.pt"

    def build() -> dict:
        images = corrupt_images(split.images, corruption, severity, seed)
        return {"images": images, "fingerprint": fingerprint(images)}

    payload = _read_cached(path, source)
    if payload is None:
        payload = build()
        save_cache(path, {"source": source, **payload})
    return DataSplit(payload["images"], split.labels.clone()), payload["fingerprint"]


def _read_cached(path: Path, source: dict) -> dict | None:
    """The corrupted images cached at ``path`` for ``source``; None (rebuild) when absent, unreadable or of others."""
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # truncated or corrupt: rebuilt and overwritten
        return None
    ok = isinstance(obj, dict) and obj.get("source") == source and {"images", "fingerprint"} <= set(obj)
    return obj if ok else None
