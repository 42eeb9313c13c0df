"""Out-of-distribution detection: how well a predictor's uncertainty tells the run's test images from others.

When and why: ``python -m swalab.results.score <run> --ood <spec>`` (docs/shift.md) sets each predictor's
uncertainty on the run's own test split (in-distribution) against another set of images (out-of-distribution, the
positives): the SWAG paper and Ovadia et al. (2019) compare SWA, SWAG, ensembles and temperature scaling so.

Scores, higher = more likely out-of-distribution: ``msp`` (1 - the maximum softmax probability, Hendrycks & Gimpel
2017), ``entropy`` (of the predictive distribution) and, for an ensemble whose members are at hand (FGE with saved
members), ``mutual_information`` (the predictive entropy minus the members' mean entropy). Metrics, computed exactly
here (a few lines of torch, no dependency): ``auroc`` (the probability that an OOD image scores above an
in-distribution one, ties counted half), ``aupr`` (average precision with OOD as the positive class) and ``fpr95`` (the
fraction of in-distribution images flagged at the threshold that flags 95% of the OOD ones).

OOD sets (all made from files on this machine, none downloaded):

* ``noise:gaussian`` / ``noise:uniform``: images of the run's shape, N(0.5, 0.25) clipped or U[0, 1], seeded;
* ``folder:<dir>``: every image file under ``<dir>`` (any depth; e.g. Imagenette), converted to the run's channels and
  resized to its image size (a box filter: 32x32 Imagenette), the first as many as the run's test split in sorted order;
* ``other-classes``: the test images of the classes a run trained without (``dataset.classes``, split-class CIFAR-10
  as in the SWAG paper); made from the run's own data by ``swalab.results.score``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from swalab.data.splits import DataSplit

SEED = 0
OTHER_CLASSES = "other-classes"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
TPR = 0.95


class OODError(ValueError):
    """An OOD set that cannot be made: one line naming ``--ood``, the value and the fix."""


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


def aupr(in_scores: torch.Tensor, out_scores: torch.Tensor) -> float:
    """Average precision with the OOD images as positives: sum over thresholds of precision x recall gained (tied
    scores taken as one threshold)."""
    scores = torch.cat([in_scores, out_scores]).double()
    positive = torch.cat([torch.zeros(len(in_scores)), torch.ones(len(out_scores))]).double()
    order = scores.argsort(descending=True)
    scores, positive = scores[order], positive[order]
    last = torch.ones(len(scores), dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]  # the end of each run of tied scores
    tp = positive.cumsum(0)[last]
    flagged = torch.arange(1, len(scores) + 1, dtype=torch.float64)[last]
    recall_gained = torch.diff(tp, prepend=torch.zeros(1)) / len(out_scores)
    return float((tp / flagged * recall_gained).sum())


def fpr_at_tpr(in_scores: torch.Tensor, out_scores: torch.Tensor, tpr: float = TPR) -> float:
    """The fraction of in-distribution images at or above the lowest threshold that flags ``tpr`` of the OOD ones."""
    k = int(np.ceil(tpr * len(out_scores)))
    threshold = out_scores.double().sort(descending=True).values[k - 1]
    return float((in_scores.double() >= threshold).double().mean())


def detection(in_scores: torch.Tensor, out_scores: torch.Tensor) -> dict[str, float]:
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


def ood_metrics(in_log_probs: torch.Tensor, out_log_probs: torch.Tensor, in_members=None, out_members=None) -> dict:
    """``{score: {auroc, aupr, fpr95}}`` of one predictor on its in-distribution and OOD log-probabilities."""
    ins, outs = uncertainty(in_log_probs, in_members), uncertainty(out_log_probs, out_members)
    return {name: detection(ins[name], outs[name]) for name in ins if name in outs}


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
    """The folder under ``scores/`` of an OOD spec's record."""
    if spec == OTHER_CLASSES:
        return f"ood-{OTHER_CLASSES}"
    kind, _, rest = spec.partition(":")
    return f"ood-noise-{rest}" if kind == "noise" else f"ood-folder-{Path(rest).resolve().name}"


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
        with Image.open(path) as image:
            image = image.convert("L" if channels == 1 else "RGB").resize(size, Image.BOX)
            a = np.asarray(image, dtype=np.uint8)
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    return torch.from_numpy(np.stack(out))
