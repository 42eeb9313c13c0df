"""CIFAR-10-C-style corrupted copies of any test split, made here, seeded, cached and fingerprinted.

When and why: a finished run is scored under shift (``python -m swalab.results.score <run> --data
cifar10c:<corruption>:<severity>``, docs/shift.md) on its own test images corrupted the way Hendrycks & Dietterich
(ICLR 2019) made CIFAR-10-C: the 15 standard corruptions at 5 severities, with the parameters of the published 32x32
generator (``make_cifar_c.py`` of hendrycks/robustness, ``PARAMETERS_32`` below, copied value for value). PyPI's
``imagecorruptions`` was checked and is not used: its functions hold the ImageNet-C (224x224) parameters inside them
(gaussian noise 0.08 .. 0.38 where CIFAR-10-C has 0.04 .. 0.10) and take no parameters, and it needs OpenCV and
scikit-image, which swalab does not; the functions below follow the published ones with numpy, scipy and Pillow.

All 15 are made here. Where the reference calls ImageMagick (motion blur, and the snow layer's blur) or OpenCV (the
defocus kernel, elastic's affine warp, frost's resize, snow's grey), the functions below do the same arithmetic with
numpy and scipy (``magick_motion_blur`` is MagickCore's ``MotionBlurImage``, read from its source), so the images
match the published ones in kind, not bit for bit. Frost blends in crops of the reference's frost photographs, which
swalab does not ship: they are read from PyPI's ``imagecorruptions`` (the same six files; only the files are read,
the package is never imported), ``pip install 'swalab[frost]'``; without it, asking for frost says so.

A corrupted split is a function of the test images, the corruption, the severity and the seed (``SEED`` unless
given): it is cached in the cache directory (``swalab.data.cache``; ``run.cache_dir`` moves it) under a name of
those four, and carries a fingerprint (sha256 of its pixels) that the scores record."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
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
FROST_PACKAGE = "imagecorruptions"  # the PyPI package whose frost/ folder holds the reference's frost photographs
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")  # the reference draws from these 5
FROST_SHRINK = 5  # the reference's cv2.resize(fx=fy=0.2) before cropping
FROST_MISSING = (f"corruption 'frost' needs the frost photographs of PyPI's {FROST_PACKAGE} (its frost/ folder), "
                 f"which is not installed: pip install 'swalab[frost]'")
GREY = np.array([0.299, 0.587, 0.114])  # OpenCV's RGB2GRAY weights
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


def _gaussian(x: np.ndarray, sigma: float, mode: str = "nearest", truncate: float = 4.0) -> np.ndarray:
    """scikit-image's ``gaussian`` (its defaults: nearest edges, 4 sigmas) on [H, W] or, channels apart, [H, W, C]."""
    sigmas = (sigma, sigma) + (0,) * (x.ndim - 2)
    return ndimage.gaussian_filter(x, sigma=sigmas, mode=mode, truncate=truncate)


def glass_blur(x, c, rng):
    """Blur, shuffle each pixel with a neighbour ``iterations`` times, blur again; as 8-bit in between.

    The reference's "swap" ``x[h, w], x[h', w'] = x[h', w'], x[h, w]`` on numpy rows copies (the second assignment
    reads the first's result), so what it does is ``x[h, w] = x[h + dy, w + dx]`` with dy, dx in {-1, 0} (``randint(-1,
    1)``), walking h and w down from the last row and column to the second: every source lies up or left of its target,
    still unvisited, so one pass equals this vectorised copy from the pass's start. ``max_delta`` is 1 at every
    severity of the 32x32 table; another would need the sequential walk."""
    sigma, delta, iterations = c
    if delta != 1:
        raise CorruptionError(f"glass_blur with max_delta {delta}: only 1 (the 32x32 table's) is made here")
    h, w = x.shape[:2]
    x = np.uint8(_gaussian(x, sigma) * 255)
    rows, cols = np.meshgrid(np.arange(2, h), np.arange(2, w), indexing="ij")
    for _ in range(iterations):
        dx, dy = rng.integers(-delta, delta, size=(2, *rows.shape))
        shuffled = x.copy()
        shuffled[rows, cols] = x[rows + dy, cols + dx]
        x = shuffled
    return _gaussian(x / 255, sigma)


def magick_motion_blur(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick's ``MotionBlurImage(radius, sigma, angle)`` (MagickCore/effect.c) on [H, W, C]: pixel (y, x) is the
    sum over taps i < 2 ceil(radius) + 1 of exp(-i^2 / 2 sigma^2) (normalised) times the pixel at the tap's offset,
    (ceil(i cos a - 0.5), ceil(i sin a - 0.5)) in (x, y), the image's edge repeated beyond it."""
    width = int(2 * np.ceil(radius) + 1)
    taps = np.arange(width)
    kernel = np.exp(-taps.astype(np.float64) ** 2 / (2 * sigma ** 2))
    kernel /= kernel.sum()
    point_x, point_y = width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle))
    length = np.hypot(point_x, point_y)
    h, w = x.shape[:2]
    out = np.zeros_like(x, dtype=np.float64)
    for i, k in enumerate(kernel):
        dx, dy = int(np.ceil(i * point_y / length - 0.5)), int(np.ceil(i * point_x / length - 0.5))
        rows, cols = np.clip(np.arange(h) + dy, 0, h - 1), np.clip(np.arange(w) + dx, 0, w - 1)
        out += k * x[rows][:, cols]
    return out


def motion_blur(x, c, rng):
    """ImageMagick's motion blur of (radius, sigma) at an angle drawn from U(-45, 45) degrees."""
    return magick_motion_blur(x, c[0], c[1], rng.uniform(-45, 45))


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


def _grey(x: np.ndarray) -> np.ndarray:
    """[H, W, 1]: OpenCV's RGB2GRAY of an RGB image, a one-channel image as it is."""
    return x if x.shape[-1] == 1 else (x @ GREY)[..., None]


def snow(x, c, rng):
    """A layer of N(c0, c1) flakes zoomed by c2, cut below c3, motion-blurred (radius c4, sigma c5, angle U(-135, -45))
    as an 8-bit image, added with its half-turn to the image greyed towards white by 1 - c6."""
    layer = rng.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    layer = clipped_zoom(layer[..., None], c[2])
    layer[layer < c[3]] = 0
    layer = np.uint8(np.clip(layer, 0, 1) * 255) / 255  # the reference goes through an 8-bit PNG
    layer = np.round(magick_motion_blur(layer, c[4], c[5], rng.uniform(-135, -45)) * 255) / 255
    x = c[6] * x + (1 - c[6]) * np.maximum(x, _grey(x) * 1.5 + 0.5)
    return x + layer + np.rot90(layer, k=2)


def frost_dir() -> Path | None:
    """The folder of frost photographs in the installed ``imagecorruptions`` (found, not imported), or None."""
    spec = importlib.util.find_spec(FROST_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if all((Path(location) / "frost" / name).is_file() for name in FROST_FILES):
            return Path(location) / "frost"
    return None


@functools.lru_cache(maxsize=1)
def frost_layers(folder: str) -> tuple[np.ndarray, ...]:
    """The five frost photographs as RGB floats in [0, 1], shrunk as the reference's ``cv2.resize(fx=0.2, fy=0.2)``
    does: bilinear at scale 5 samples source pixel 5 j + 2 exactly, so rows and columns 2, 7, 12, ... (rounded size)."""
    layers = []
    for name in FROST_FILES:
        with Image.open(Path(folder) / name) as image:
            a = np.asarray(image.convert("RGB"), dtype=np.float64) / 255
        h, w = round(a.shape[0] / FROST_SHRINK), round(a.shape[1] / FROST_SHRINK)
        layers.append(a[FROST_SHRINK // 2::FROST_SHRINK, FROST_SHRINK // 2::FROST_SHRINK][:h, :w])
    return tuple(layers)


def frost(x, c, rng):
    """c0 x the image + c1 x a random crop of one of the five shrunk frost photographs (greyed for one channel)."""
    folder = frost_dir()
    if folder is None:
        raise CorruptionError(FROST_MISSING)
    layer = frost_layers(str(folder))[rng.integers(len(FROST_FILES))]
    h, w = x.shape[:2]
    top, left = rng.integers(0, layer.shape[0] - h), rng.integers(0, layer.shape[1] - w)
    crop = layer[top:top + h, left:left + w]
    return c[0] * x + c[1] * (_grey(crop) if x.shape[-1] == 1 else crop)


def affine_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2x3 affine map taking three (x, y) points ``src`` to ``dst`` (OpenCV's ``getAffineTransform``)."""
    return np.linalg.solve(np.c_[src, np.ones(3)], dst).T


def warp_affine(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """OpenCV's ``warpAffine(x, m, borderMode=BORDER_REFLECT_101)``: output (x, y) is bilinear at m^-1 (x, y), the
    border mirrored about its edge pixels (scipy's ``mirror``)."""
    inverse = np.linalg.inv(np.r_[m, [[0, 0, 1]]])[:2]
    ys, xs = np.mgrid[0:x.shape[0], 0:x.shape[1]].astype(np.float64)
    src_x = inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]
    src_y = inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]
    return np.stack([ndimage.map_coordinates(x[..., d], [src_y, src_x], order=1, mode="mirror")
                     for d in range(x.shape[-1])], axis=-1)


def elastic_transform(x, c, rng):
    """A random affine warp (corners moved by up to c2 pixels), then a smooth displacement field (uniform noise blurred
    by sigma c1, times c0). The reference's values are fractions of the image side (``IMSIZE * ...``), so they scale
    by side / 32 here: the table's values at 32x32."""
    h, w = x.shape[:2]
    alpha, sigma, shift = (v * min(h, w) / 32 for v in c)
    center, square = np.float64([h, w]) // 2, min(h, w) // 3  # the reference's (H, W) order, taken as (x, y)
    src = np.array([center + square, [center[0] + square, center[1] - square], center - square])
    dst = src + rng.uniform(-shift, shift, size=src.shape)
    x = warp_affine(x, affine_from_points(src, dst))
    dx = _gaussian(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha
    dy = _gaussian(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    return np.stack([ndimage.map_coordinates(x[..., d], [ys + dy, xs + dx], order=1, mode="reflect")
                     for d in range(x.shape[-1])], axis=-1)


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


MADE: dict[str, Callable] = {f.__name__: f for f in (
    gaussian_noise, shot_noise, impulse_noise, defocus_blur, glass_blur, motion_blur, zoom_blur, snow, frost, fog,
    brightness, contrast, elastic_transform, pixelate, jpeg_compression)}  # CIFAR-10-C's order


# -- a corrupted split -------------------------------------------------------------------------------------------------
def check(corruption: str, severity: int) -> None:
    """Refuse, before anything is computed, a corruption or severity that cannot be made here."""
    if corruption not in PARAMETERS_32:
        raise CorruptionError(f"corruption {corruption!r} is not one of CIFAR-10-C's 15: {', '.join(CORRUPTIONS)}")
    if corruption == "frost" and frost_dir() is None:
        raise CorruptionError(FROST_MISSING)
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
