"""Out-of-distribution detection: how well a predictor's uncertainty tells the run's test images from others.

When and why: ``python -m swalab.results.score <run> --ood <spec>`` (docs/shift.md) sets each predictor's
uncertainty on the run's own test split (in-distribution) against another set of images (out-of-distribution, the
positives): the SWAG paper and Ovadia et al. (2019) compare SWA, SWAG, ensembles and temperature scaling so.

Scores, higher = more likely out-of-distribution: ``msp`` (1 - the maximum softmax probability, Hendrycks & Gimpel
2017), ``entropy`` (of the predictive distribution) and, for an ensemble whose members are at hand (FGE with saved
members), ``mutual_information`` (the predictive entropy minus the members' mean entropy). Metrics, computed exactly
here (a few lines of torch, no dependency): ``auroc`` (the probability that an OOD image scores above an
in-distribution one, ties counted half), ``aupr`` (average precision with OOD as the positive class) and ``fpr95`` (the
fraction of in-distribution images flagged at the threshold that flags 95% of the OOD ones); :func:`roc_curve`, whose
area is ``auroc``. Each image's scores are kept beside the metrics (:data:`PER_IMAGE_FILE`, float16) for the report's
ROC curves.

OOD sets (all made from files on this machine, none downloaded):

* ``noise:gaussian`` / ``noise:uniform``: images of the run's shape, N(0.5, 0.25) clipped or U[0, 1], seeded;
* ``folder:<dir>``: every image file under ``<dir>`` (any depth; e.g. Imagenette), converted to the run's channels and
  resized to its image size (a box filter: 32x32 Imagenette), the first as many as the run's test split in sorted order;
* ``other-classes``: the test images of the classes a run trained without (``dataset.classes``, split-class CIFAR-10
  as in the SWAG paper); made from the run's own data by ``swalab.results.score``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from swalab.config import ConfigError
from swalab.data.splits import DataSplit

SEED = 0
OTHER_CLASSES = "other-classes"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TPR = 0.95


class OODError(ConfigError):
    """An OOD set that cannot be made: one line naming ``--ood``, the value and the fix (a user's error)."""


# -- the metrics -----------------------------------------------------------------------------------------------------
def auroc(in_scores: torch.Tensor, out_scores: torch.Tensor) -> float:
    """P(an OOD score > an in-distribution score) + P(equal) / 2: the area under the ROC curve, exactly (ranks)."""
    scores = torch.cat([in_scores, out_scores]).double()
    ranks = _average_ranks(scores)
    n_in, n_out = len(in_scores), len(out_scores)
    return float((ranks[n_in:].sum() - n_out * (n_out + 1) / 2) / (n_in * n_out))


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``x``, ties given their mean rank."""
    values, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    return ((ends - counts.double() + 1 + ends) / 2)[inverse]


def flagged_counts(in_scores: torch.Tensor, out_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """At each distinct score taken as a threshold, from the highest down (flag every image scoring at or above it;
    tied scores one threshold): how many OOD images (true positives) and in-distribution ones (false positives) are
    flagged, in float64. What :func:`aupr` and :func:`roc_curve` both sum over."""
    scores = torch.cat([in_scores, out_scores]).double()
    positive = torch.cat([torch.zeros(len(in_scores)), torch.ones(len(out_scores))]).double()
    order = scores.argsort(descending=True)
    scores, positive = scores[order], positive[order]
    last = torch.ones(len(scores), dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]  # the end of each run of tied scores
    return positive.cumsum(0)[last], (1 - positive).cumsum(0)[last]


def aupr(in_scores: torch.Tensor, out_scores: torch.Tensor) -> float:
    """Average precision with the OOD images as positives: sum over thresholds of precision x recall gained (tied
    scores taken as one threshold)."""
    tp, fp = flagged_counts(in_scores, out_scores)
    recall_gained = torch.diff(tp, prepend=torch.zeros(1)) / len(out_scores)
    return float((tp / (tp + fp) * recall_gained).sum())


def fpr_at_tpr(in_scores: torch.Tensor, out_scores: torch.Tensor, tpr: float = TPR) -> float:
    """The fraction of in-distribution images at or above the lowest threshold that flags ``tpr`` of the OOD ones."""
    k = int(np.ceil(tpr * len(out_scores)))
    threshold = out_scores.double().sort(descending=True).values[k - 1]
    return float((in_scores.double() >= threshold).double().mean())


def roc_curve(in_scores: torch.Tensor, out_scores: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve, OOD images the positives: ``(fpr, tpr)`` from (0, 0) to (1, 1), one point per distinct score
    taken as a threshold (flag every image scoring at or above it; tied scores one point), so that the area under
    the straight lines joining the points is :func:`auroc` exactly (ties counted half)."""
    tp, fp = flagged_counts(in_scores, out_scores)
    fpr = np.concatenate([[0.0], (fp / max(len(in_scores), 1)).numpy()])
    tpr = np.concatenate([[0.0], (tp / max(len(out_scores), 1)).numpy()])
    return fpr, tpr


def detection(in_scores: torch.Tensor, out_scores: torch.Tensor) -> dict[str, float]:
    """AUROC, AUPR and FPR at 95% TPR of one score, OOD images the positives."""
    return {"auroc": auroc(in_scores, out_scores), "aupr": aupr(in_scores, out_scores),
            "fpr95": fpr_at_tpr(in_scores, out_scores)}


# -- the scores ------------------------------------------------------------------------------------------------------
def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    log_probs = log_probs.double()
    return -(log_probs.exp() * log_probs).nan_to_num().sum(dim=1)


def uncertainty(log_probs: torch.Tensor, members: list[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Per image, higher = more likely OOD: ``msp``, ``entropy``, and with ``members`` ``mutual_information``."""
    out = {"msp": 1 - log_probs.double().exp().max(dim=1).values, "entropy": entropy(log_probs)}
    if members:
        out["mutual_information"] = out["entropy"] - torch.stack([entropy(m) for m in members]).mean(dim=0)
    return out


def per_image(in_log_probs: torch.Tensor, out_log_probs: torch.Tensor, in_members=None, out_members=None,
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{score: (in-distribution scores, OOD scores)}`` of one predictor, a number per image (:func:`uncertainty`)."""
    ins, outs = uncertainty(in_log_probs, in_members), uncertainty(out_log_probs, out_members)
    return {name: (ins[name], outs[name]) for name in ins if name in outs}


# -- the per-image scores, kept for ROC curves -------------------------------------------------------------------------
#: beside an OOD set's ``metrics.json``: every predictor's per-image scores, float16 (a ROC curve needs them)
PER_IMAGE_FILE = "per_image_scores.pt"


def kept_scores(scores: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> dict:
    """What :data:`PER_IMAGE_FILE` holds of ``{predictor: {score: (in, out)}}``: float16 per image (2 bytes; a score in
    [0, log K] keeps 3 significant digits, enough to draw a curve; the AUROC of ``metrics.json`` is from the full
    precision), OOD images the positives."""
    return {"positive": "out-of-distribution",
            "predictors": {name: {score: {"in": ins.half(), "out": outs.half()} for score, (ins, outs) in by.items()}
                           for name, by in scores.items()}}


def read_kept_scores(path: Path) -> dict | None:
    """``{predictor: {score: (in, out)}}`` (float32) of a :data:`PER_IMAGE_FILE`, or None where there is none (an OOD
    set scored before they were kept) or it cannot be read."""
    try:
        kept = torch.load(path, map_location="cpu", weights_only=True)
        return {name: {score: (v["in"].float(), v["out"].float()) for score, v in by.items()}
                for name, by in kept["predictors"].items()}
    except Exception:  # noqa: BLE001  missing or damaged: no curve, and the report says why
        return None


# -- the OOD sets ----------------------------------------------------------------------------------------------------
def check_spec(spec: str) -> None:
    """Refuse, before any run is opened, an OOD spec that names nothing this module makes."""
    kind, _, rest = spec.partition(":")
    if kind == "noise" and rest in ("gaussian", "uniform") or spec == OTHER_CLASSES:
        return
    if kind == "folder" and rest:
        if not Path(rest).is_dir():
            raise OODError(f"--ood {spec}: {rest} is no folder; give a folder of images (any depth)")
        return
    raise OODError(f"--ood {spec}: expected noise:gaussian, noise:uniform, folder:<dir> or {OTHER_CLASSES}")


def spec_name(spec: str) -> str:
    """The folder under ``scores/`` of an OOD spec's record, and its name in the report. A folder's is its last
    component and 8 hex digits of its resolved path (``ood-folder-val-1c0e7b2a``): Imagenette's ``val`` and another
    data set's ``val`` are two sets, never one record written over the other; the same folder however typed (relative,
    absolute, through a link) is one."""
    if spec == OTHER_CLASSES:
        return f"ood-{OTHER_CLASSES}"
    kind, _, rest = spec.partition(":")
    if kind == "noise":
        return f"ood-noise-{rest}"
    where = Path(rest).resolve()
    return f"ood-folder-{where.name}-{hashlib.sha256(str(where).encode()).hexdigest()[:8]}"


def ood_split(spec: str, like: DataSplit) -> DataSplit:
    """The OOD images of ``spec`` shaped like ``like`` (its count, channels and size; labels all 0, never read)."""
    check_spec(spec)
    n, c, h, w = like.images.shape
    kind, _, rest = spec.partition(":")
    if kind == "noise":
        rng = np.random.default_rng(SEED)
        pixels = rng.normal(0.5, 0.25, (n, c, h, w)) if rest == "gaussian" else rng.uniform(0, 1, (n, c, h, w))
        images = torch.from_numpy(np.uint8(np.clip(pixels, 0, 1) * 255))
    else:
        images = folder_images(Path(rest), n, c, (w, h))
    return DataSplit(images, torch.zeros(len(images), dtype=torch.long))


def folder_images(root: Path, limit: int, channels: int, size: tuple[int, int]) -> torch.Tensor:
    """The first ``limit`` image files under ``root`` (sorted paths), as uint8 [N, C, H, W] of ``size`` (W, H)."""
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:limit]
    if not files:
        raise OODError(f"--ood folder:{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) under it")
    out = []
    for path in files:
        try:
            with Image.open(path) as image:
                image = image.convert("L" if channels == 1 else "RGB").resize(size, Image.BOX)
                a = np.asarray(image, dtype=np.uint8)
        except OSError as exc:  # cut short, or no image its name says it is (PIL's UnidentifiedImageError)
            raise OODError(f"--ood folder:{root}: {path} cannot be read as an image ({exc}): replace or remove "
                           "it") from None
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    return torch.from_numpy(np.stack(out))
