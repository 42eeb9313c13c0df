"""Score any predictor the same way: accuracy, mean NLL and ECE from probabilities computed once.

A *predictor* is anything that turns a loader into class probabilities ``[N, C]``: a single
network (``ModelPredictor``: SGD's last iterate, the SWA average, the EMA) or an ensemble of
cached member probabilities (``CachedEnsemble``: FGE). Because all of them end in the same
``metrics_from_probs``, a single model and an ensemble stand in one table on equal terms.

NLL is the *mean* negative log-likelihood per test example (not a sum, a frequent source of
confusion in the reference code's users), ECE uses 15 equal-width confidence bins.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from swalab import distributed

ECE_BINS = 15


class Predictor(Protocol):
    """Anything that maps a loader of (x, y) batches to probabilities [N, C] on the CPU."""

    def predict_proba(self, loader: Iterable) -> torch.Tensor: ...


def autocast_for(device: torch.device, enabled: bool = True):
    """bf16 autocast on CUDA (when enabled), a no-op context elsewhere."""
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def predict_logits(model: nn.Module, loader: Iterable, device: torch.device, amp: bool = True) -> torch.Tensor:
    """Logits of ``model`` on every batch of ``loader``, in eval mode, as float32 on the CPU.

    The model's train/eval mode is restored afterwards, so scoring mid-training never leaves
    the live model in eval mode (and eval mode never touches BN running statistics).
    Data-parallel (``swalab.distributed``): call it on every rank; each scores its share of the batches
    with rank 0's buffers and every rank gets all the logits, in the loader's order.
    """
    was_training = model.training
    distributed.sync_buffers(model)
    model.eval()
    outputs = []
    try:
        for x, _ in distributed.shard_batches(loader):
            x = x.to(device, non_blocking=True)
            with autocast_for(device, amp):
                outputs.append(model(x).float())
    finally:
        model.train(was_training)
    return distributed.gather_batches(outputs)


def labels_of(loader: Iterable) -> torch.Tensor:
    """All labels of a loader, in order, on the CPU (read from ``loader.labels`` when it knows them)."""
    known = getattr(loader, "labels", None)
    if isinstance(known, torch.Tensor):  # a streaming loader: no decoding pass just to collect labels
        return known.cpu()
    return torch.cat([y.cpu() for _, y in loader])


class ModelPredictor:
    """A single network as a predictor (softmax of its logits)."""

    def __init__(self, model: nn.Module, device: torch.device, amp: bool = True):
        self.model, self.device, self.amp = model, device, amp

    def predict_proba(self, loader: Iterable) -> torch.Tensor:
        return predict_logits(self.model, loader, self.device, self.amp).softmax(dim=1)


class CachedProbs:
    """Probabilities scored earlier (e.g. the SWA average at a budget mark), kept as a predictor."""

    def __init__(self, probs: torch.Tensor):
        self.probs = probs.float().cpu()

    def predict_proba(self, loader: Iterable | None = None) -> torch.Tensor:
        return self.probs


class CachedEnsemble:
    """The mean of member softmax probabilities computed once per member (FGE).

    Adding a member costs one forward pass over the test set when it is collected; scoring the
    ensemble of the first k members afterwards costs no forward pass at all.
    """

    def __init__(self, member_probs: Sequence[torch.Tensor] = ()):
        self.member_probs: list[torch.Tensor] = list(member_probs)

    def add(self, probs: torch.Tensor) -> None:
        self.member_probs.append(probs.float().cpu())

    def __len__(self) -> int:
        return len(self.member_probs)

    def probs(self, k: int | None = None) -> torch.Tensor:
        """Ensemble probabilities of the first ``k`` members (all by default)."""
        return ensemble_mean(self.member_probs[: k or len(self.member_probs)])

    def predict_proba(self, loader: Iterable | None = None) -> torch.Tensor:
        return self.probs()

    def curve(self, labels: torch.Tensor) -> list[dict]:
        """Metrics of the ensemble of the first k members, for k = 1 .. n (no forward pass)."""
        return [{"members": k, **metrics_from_probs(self.probs(k), labels)}
                for k in range(1, len(self.member_probs) + 1)]


def ensemble_mean(member_probs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An ensemble's prediction: the mean of its members' class probabilities (summed in float64)."""
    if not member_probs:
        raise ValueError("the ensemble has no members yet: nothing to score")
    return torch.stack([p.double() for p in member_probs]).mean(dim=0).to(member_probs[0].dtype)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE with ``bins`` equal-width confidence bins: sum_b |B_b|/N * |acc(B_b) - conf(B_b)|."""
    rows = reliability_bins(probs, labels, bins)
    total = sum(r["count"] for r in rows)
    return sum(r["count"] / total * abs(r["acc"] - r["conf"]) for r in rows if r["count"]) if total else 0.0


def reliability_bins(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> list[dict]:
    """Per-bin count, accuracy and mean confidence (equal-width confidence bins), for reliability diagrams."""
    confidence, predicted = probs.max(dim=1)
    correct = predicted.eq(labels).float()
    edges = torch.linspace(0, 1, bins + 1)
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > lo) & (confidence <= hi)
        n = int(in_bin.sum())
        rows.append({"lo": float(lo), "hi": float(hi), "count": n,
                     "acc": float(correct[in_bin].mean()) if n else None,
                     "conf": float(confidence[in_bin].mean()) if n else None})
    return rows


def metrics_from_probs(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy (%), mean NLL, ECE (and top-5 accuracy when there are more than 5 classes)."""
    probs = probs.float()
    labels = labels.long()
    nll = F.nll_loss(probs.clamp_min(1e-12).log(), labels, reduction="mean")
    out = {
        "acc": 100.0 * float(probs.argmax(dim=1).eq(labels).float().mean()),
        "nll": float(nll),
        "ece": expected_calibration_error(probs, labels),
    }
    if probs.shape[1] > 5:
        top5 = probs.topk(5, dim=1).indices.eq(labels[:, None]).any(dim=1)
        out["top5"] = 100.0 * float(top5.float().mean())
    return out


def recompute_bn(model: nn.Module, loader, device: torch.device, amp: bool = False) -> None:
    """Recompute ``model``'s BatchNorm statistics with one pass over ``loader`` (train mode, exact cumulative
    average, no grad: ``torch.optim.swa_utils.update_bn``), the loader's epoch-0 augmentation when it has one.

    Data-parallel: call it on every rank; each runs its share of the batches and the ranks' sums are combined
    (``swalab.distributed.reduce_bn_statistics``), so all end with the statistics of the whole pass."""
    from torch.optim.swa_utils import update_bn

    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    with autocast_for(device, amp):
        update_bn(distributed.shard_batches(loader), model, device=device)
    distributed.reduce_bn_statistics(model)


def metrics_table(metrics: dict[str, dict]) -> str:
    """``predictor  acc %  nll  ece`` lines: the table a run and ``swalab.results.compare`` print."""
    width = max([len(name) for name in metrics] + [12])
    lines = [f"{'predictor':<{width}} {'acc %':>8} {'nll':>8} {'ece':>8}"]
    for name, m in metrics.items():
        if "acc" in m:
            lines.append(f"{name:<{width}} {m['acc']:8.2f} {m['nll']:8.4f} {m['ece']:8.4f}")
    return "\n".join(lines)


def mean_loss_and_accuracy(model: nn.Module, loader: Iterable, device: torch.device,
                           loss_fn: Callable = F.cross_entropy, amp: bool = True,
                           labels: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean loss and accuracy (%) of one network, used for the per-epoch test columns.

    Pass ``labels`` when they are already known, to spare a second pass over the loader.
    """
    logits = predict_logits(model, loader, device, amp)
    labels = labels_of(loader) if labels is None else labels
    return float(loss_fn(logits, labels)), 100.0 * float(logits.argmax(1).eq(labels).float().mean())
