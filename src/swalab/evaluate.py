"""Score any predictor the same way: accuracy, mean NLL and ECE from probabilities computed once.

A *predictor* is anything that turns a loader into class log-probabilities ``[N, C]``: a single
network (``ModelPredictor``: SGD's last iterate, the SWA average, the EMA) or an ensemble of
cached member log-probabilities (``CachedEnsemble``: FGE). Because all of them end in the same
``metrics_from_log_probs``, a single model and an ensemble stand in one table on equal terms.

NLL is the *mean* negative log-likelihood per test example (not a sum, a frequent source of
confusion in the reference code's users), computed one way: from log-probabilities, which a single
network gives as the log-softmax of its logits (the same number as the cross-entropy of the per-epoch
test line) and an ensemble as the log of its members' mean probability (a log-mean-exp, so no
probability is ever rounded to 0 and clamped). ECE is scored twice: ``ece`` with 15 equal-width confidence bins
(Guo et al. 2017, the common choice) and ``ece_mass20`` with 20 equal-mass bins (the SWAG paper's calibration, Maddox
et al. 2019), so numbers can be set beside either; every table says which. Top-5 is ranked on log-probabilities:
below log p ~ -103 a float32 probability is 0 and such classes would tie.

Everything here scores in float32 (``swalab.precision.scoring_precision``), whatever precision the model was
trained in: the numbers a run reports differ from another run's only through the weights."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from swalab import distributed
from swalab.calibration import fit_temperature, scaled, scaled_name
from swalab.precision import scoring_precision

ECE_BINS = 15        # ``ece``: equal-width confidence bins (Guo et al. 2017)
ECE_MASS_BINS = 20   # ``ece_mass20``: equal-mass bins (Maddox et al. 2019, the SWAG paper's calibration)
ECE_LEGEND = (f"ece: {ECE_BINS} equal-width confidence bins (Guo et al. 2017); "
              f"ece_mass20: {ECE_MASS_BINS} equal-mass bins (the SWAG paper's)")


class Predictor(Protocol):
    """Anything that maps a loader of (x, y) batches to log-probabilities [N, C] (float32, on the CPU).

    A predictor computed once, when its model was at hand (``CachedLogProbs``, ``CachedEnsemble``), ignores the
    loader and returns the test set's; it says what it knows of the validation split through ``val_log_proba()``
    (None: nothing). Every other predictor scores the validation split from its loader (:func:`val_log_probs_of`)."""

    def predict_log_proba(self, loader: Iterable) -> torch.Tensor: ...


@torch.no_grad()
def predict_logits(model: nn.Module, loader: Iterable, device: torch.device) -> torch.Tensor:
    """Logits of ``model`` on every batch of ``loader``, in eval mode, computed in float32 (autocast off, even
    inside a caller's autocast region), on the CPU.

    The model's train/eval mode is restored afterwards, so scoring mid-training never leaves
    the live model in eval mode (and eval mode never touches BN running statistics).
    Data-parallel (``swalab.distributed``): call it on every rank; each scores its share of the batches
    with rank 0's buffers and every rank gets all the logits, in the loader's order."""
    was_training = model.training
    distributed.sync_buffers(model)
    model.eval()
    outputs = []
    try:
        with scoring_precision(device):
            for x, _ in distributed.shard_batches(loader):
                outputs.append(model(x.to(device, non_blocking=True)).float())
    finally:
        model.train(was_training)
    return distributed.gather_batches(outputs)


def labels_of(loader: Iterable) -> torch.Tensor:
    """All labels of a loader, in order, on the CPU (read from ``loader.labels`` when it knows them)."""
    known = getattr(loader, "labels", None)
    if isinstance(known, torch.Tensor):  # a streaming loader: no decoding pass just to collect labels
        return known.cpu()
    return torch.cat([y.cpu() for _, y in loader])


def predict_log_probs(model: nn.Module, loader: Iterable, device: torch.device) -> torch.Tensor:
    """Log-probabilities of ``model`` on ``loader``: the log-softmax of its float32 logits (CPU)."""
    return predict_logits(model, loader, device).log_softmax(dim=1)


def log_of(probs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of probabilities that were stored as such (files written before swalab kept
    log-probabilities): a probability rounded to 0 becomes the smallest float32, not -inf."""
    return probs.float().clamp_min(torch.finfo(torch.float32).tiny).log()


class ModelPredictor:
    """A single network as a predictor (log-softmax of its logits)."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.device = model, device

    def predict_log_proba(self, loader: Iterable) -> torch.Tensor:
        return predict_log_probs(self.model, loader, self.device)


class CachedLogProbs:
    """Log-probabilities scored earlier (e.g. the SWA average at a budget mark), kept as a predictor; with a
    validation split, its log-probabilities there too (``val_log_probs``)."""

    def __init__(self, log_probs: torch.Tensor, val_log_probs: torch.Tensor | None = None):
        self.log_probs = log_probs.float().cpu()
        self.val_log_probs = None if val_log_probs is None else val_log_probs.float().cpu()

    def predict_log_proba(self, loader: Iterable | None = None) -> torch.Tensor:
        return self.log_probs

    def val_log_proba(self) -> torch.Tensor | None:
        return self.val_log_probs


class CachedEnsemble:
    """The mean of member probabilities, from log-probabilities computed once per member (FGE, SWAG's samples).

    Adding a member costs one forward pass over the test set when it is collected (and one over the validation
    split, when there is one: ``add(test, val)``); scoring the ensemble of the first k members afterwards costs no
    forward pass at all."""

    def __init__(self, member_log_probs: Sequence[torch.Tensor] = (),
                 member_val_log_probs: Sequence[torch.Tensor] = ()):
        self.member_log_probs: list[torch.Tensor] = [p.float().cpu() for p in member_log_probs]
        self.member_val_log_probs: list[torch.Tensor] = [p.float().cpu() for p in member_val_log_probs]

    def add(self, log_probs: torch.Tensor, val_log_probs: torch.Tensor | None = None) -> None:
        self.member_log_probs.append(log_probs.float().cpu())
        if val_log_probs is not None:
            self.member_val_log_probs.append(val_log_probs.float().cpu())

    def __len__(self) -> int:
        return len(self.member_log_probs)

    def log_probs(self, k: int | None = None) -> torch.Tensor:
        """Ensemble log-probabilities of the first ``k`` members (all by default)."""
        return ensemble_log_mean(self.member_log_probs[: k or len(self.member_log_probs)])

    def predict_log_proba(self, loader: Iterable | None = None) -> torch.Tensor:
        return self.log_probs()

    def val_log_proba(self) -> torch.Tensor | None:
        """The ensemble's log-probabilities on the validation split; None unless every member was scored there."""
        if not self.member_val_log_probs or len(self.member_val_log_probs) != len(self.member_log_probs):
            return None
        return ensemble_log_mean(self.member_val_log_probs)

    def curve(self, labels: torch.Tensor) -> list[dict]:
        """Metrics of the ensemble of the first k members, for k = 1 .. n (no forward pass). The members' log-sum-exp
        is carried from k to k + 1 in float64, so the whole curve costs one pass over the members, not n^2 / 2."""
        points, log_sum = [], None
        for k, member in enumerate(self.member_log_probs, start=1):
            log_sum = member.double() if log_sum is None else torch.logaddexp(log_sum, member.double())
            points.append({"members": k, **metrics_from_log_probs((log_sum - math.log(k)).float(), labels)})
        return points


def val_log_probs_of(predictor: Predictor, loader: Iterable, labels: torch.Tensor, name: str) -> torch.Tensor | None:
    """``predictor``'s log-probabilities on the validation split (``loader``, whose labels are ``labels``): what a
    cached predictor knows of it (``val_log_proba``), else its prediction on ``loader``. A predictor whose answer
    does not have one row per validation image ignored the loader (it was computed on the test set): refused,
    naming ``name``, rather than scored on the wrong images."""
    cached = getattr(predictor, "val_log_proba", None)
    log_probs = cached() if callable(cached) else predictor.predict_log_proba(loader)
    if log_probs is None:
        return None
    if log_probs.shape[0] != len(labels):
        raise RuntimeError(f"predictor {name!r} gave {log_probs.shape[0]} rows for the {len(labels)} validation images: "
                           "a predictor computed once on the test set must say what it knows of the validation "
                           "split through val_log_proba() (swalab.evaluate.CachedLogProbs takes both)")
    return log_probs.float()


def ensemble_log_mean(member_log_probs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An ensemble's prediction as log-probabilities: the log of its members' mean probability, computed as a
    log-mean-exp in float64 (exact where a member's probability underflows float32)."""
    if not member_log_probs:
        raise ValueError("the ensemble has no members yet: nothing to score")
    stacked = torch.stack([p.double() for p in member_log_probs])
    return (torch.logsumexp(stacked, dim=0) - math.log(len(member_log_probs))).float()


def ensemble_mean(member_probs: Sequence[torch.Tensor]) -> torch.Tensor:
    """An ensemble's class probabilities from its members' probabilities (summed in float64)."""
    if not member_probs:
        raise ValueError("the ensemble has no members yet: nothing to score")
    return torch.stack([p.double() for p in member_probs]).mean(dim=0).to(member_probs[0].dtype)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE with ``bins`` equal-width confidence bins: sum_b |B_b|/N * |acc(B_b) - conf(B_b)|."""
    rows = reliability_bins(probs, labels, bins)
    total = sum(r["count"] for r in rows)
    return sum(r["count"] / total * abs(r["acc"] - r["conf"]) for r in rows if r["count"]) if total else 0.0


def equal_mass_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_MASS_BINS) -> float:
    """ECE with ``bins`` equal-mass bins: the images sorted by confidence and cut into ``bins`` runs of (nearly) equal
    count, sum_b |B_b|/N * |acc(B_b) - conf(B_b)| (the SWAG paper's calibration; the authors' ``calibration_curve``
    takes the same quantile edges but leaves out the images that lie on an edge). Fewer images than bins: one a bin."""
    if len(labels) == 0:
        return 0.0
    confidence, predicted = probs.double().max(dim=1)
    correct = predicted.eq(labels).double()
    order = confidence.argsort()
    total = len(labels)
    return float(sum(len(b) / total * abs(correct[b].mean() - confidence[b].mean())
                     for b in order.tensor_split(min(bins, total)) if len(b)))


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


@dataclass(frozen=True)
class Metric:
    """One score of a predictor, defined once: ``metrics_from_log_probs`` computes it for every predictor and, where
    ``reported``, the report's tables, CSV and ensembles of seeds and the W&B mirror read it from here."""

    name: str      # its key in metrics.json
    title: str     # the heading of its own table in a report
    heading: str   # its column beside the other metrics
    compute: Callable[[torch.Tensor, torch.Tensor], float | None]  # (float log-probabilities, labels); None: not here
    digits: int = 4
    reported: bool = True  # False: kept in metrics.json only


# Every metric of every predictor, in the order files and tables show them: a metric of one's own is one entry here.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("acc", "Test accuracy (%)", "accuracy %", digits=2,
           compute=lambda lp, y: 100.0 * float(lp.argmax(dim=1).eq(y).float().mean())),
    Metric("nll", "Test NLL (mean per image)", "NLL", lambda lp, y: float(F.nll_loss(lp, y, reduction="mean"))),
    Metric("ece", "Test ECE (15 equal-width bins, Guo et al.)", "ECE (15 equal-width bins)",
           lambda lp, y: expected_calibration_error(lp.exp(), y)),
    Metric("ece_mass20", "Test ECE (20 equal-mass bins, the SWAG paper's)", "ECE (20 equal-mass bins)",
           lambda lp, y: equal_mass_calibration_error(lp.exp(), y), reported=False),
    Metric("brier", "Test Brier score (mean per image)", "Brier", lambda lp, y: brier_score(lp.exp(), y)),
    Metric("top5", "Test top-5 accuracy (%)", "top-5 %", digits=2, reported=False,  # ranked on log-probabilities
           compute=lambda lp, y: 100.0 * float(lp.topk(5, dim=1).indices.eq(y[:, None]).any(dim=1).float().mean())
           if lp.shape[1] > 5 else None),
)}


def reported_metrics() -> list[Metric]:
    """The metrics a report shows (``Metric.reported``), in order."""
    return [m for m in METRICS.values() if m.reported]


def metrics_from_log_probs(log_probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Every metric of ``METRICS`` (accuracy %, mean NLL, ECE, Brier score, top-5 accuracy when there are more than 5
    classes) of one predictor's log-probabilities: every metric of every predictor comes from here."""
    log_probs, labels = log_probs.float(), labels.long()
    values = {name: metric.compute(log_probs, labels) for name, metric in METRICS.items()}
    return {name: value for name, value in values.items() if value is not None}


def brier_score(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean over images of sum_k (p_k - 1[y = k])^2 (Brier 1950; 0 is perfect, 2 the worst)."""
    onehot = F.one_hot(labels.long(), probs.shape[1]).to(torch.float64)
    return float((probs.double() - onehot).pow(2).sum(dim=1).mean())


def metrics_from_probs(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """:func:`metrics_from_log_probs` for predictions known only as probabilities (files of earlier versions)."""
    return metrics_from_log_probs(log_of(probs), labels)


@torch.no_grad()
def recompute_bn(model: nn.Module, loader, device: torch.device) -> None:
    """Recompute ``model``'s BatchNorm statistics with one pass over ``loader`` (train mode, no grad, float32): the
    exact cumulative average of the batches' statistics, the loader's epoch-0 augmentation when it has one.

    The result is that of ``torch.optim.swa_utils.update_bn``, bit for bit (tests/test_speed_invariants.py), without
    its host syncs: ``update_bn`` sets every layer's momentum to None, and BatchNorm then reads
    ``num_batches_tracked`` into Python on every batch (``1 / float(num_batches_tracked)``: one device sync per
    layer per batch, 163 a batch for PreResNet-164). Here a forward pre-hook counts each layer's batches in Python
    and hands it momentum ``1 / k`` before its k-th batch, which is the same update; a layer a batch skips (a
    branch not taken) is not counted for it, as with ``num_batches_tracked``. One momentum set for every layer per
    batch would be cheaper (no hook: ~5% of a PreResNet-164 BN batch on a CPU, bench/host_syncs.py, where a sync
    costs nothing) but wrong for such a layer.

    Data-parallel: call it on every rank; each runs its share of the batches and the ranks' sums are combined
    (``swalab.distributed.reduce_bn_statistics``), so all end with the statistics of the whole pass."""
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    if not layers:
        return
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(0)
    batches = {m: 0 for m in layers}
    momenta = {m: m.momentum for m in layers}

    def count(module: _BatchNorm, args) -> None:
        batches[module] += 1
        module.momentum = 1.0 / batches[module]

    for m in layers:
        m.reset_running_stats()
    handles = [m.register_forward_pre_hook(count) for m in layers]
    was_training = model.training
    model.train()
    try:
        with scoring_precision(device):
            for batch in distributed.shard_batches(loader):
                x = batch[0] if isinstance(batch, (list, tuple)) else batch
                model(x.to(device, non_blocking=True))
    finally:
        for h in handles:
            h.remove()
        for m, momentum in momenta.items():
            m.momentum = momentum
        model.train(was_training)
    distributed.reduce_bn_statistics(batches)


AT_BOUND = "*"  # marks a +ts predictor whose temperature lies at its search bound (swalab.calibration)


def metrics_table(metrics: dict[str, dict]) -> str:
    """``predictor  acc %  nll  ece  [ece_mass20]  brier`` lines: the table a run and ``swalab.results.compare`` print,
    with a line naming each ECE's binning (``ECE_LEGEND``; ``ece_mass20`` shown when a predictor has it). A ``+ts``
    predictor whose temperature was fitted to its search bound (``temperature_at_bound``) is marked, with a line
    below saying what that means."""
    from swalab.calibration import BOUNDS

    marked = {name: AT_BOUND if m.get("temperature_at_bound") else "" for name, m in metrics.items()}
    width = max([len(name) + len(marked[name]) for name in metrics] + [12])
    mass = any("ece_mass20" in m for m in metrics.values())
    lines = [f"{'predictor':<{width}} {'acc %':>8} {'nll':>8} {'ece':>8}" + (f" {'ece_mass20':>10}" if mass else "")
             + f" {'brier':>8}"]
    for name, m in metrics.items():
        if "acc" in m:
            brier = f"{m['brier']:8.4f}" if "brier" in m else f"{'–':>8}"
            ece_mass = (f" {m['ece_mass20']:10.4f}" if "ece_mass20" in m else f" {'–':>10}") if mass else ""
            lines.append(f"{name + marked[name]:<{width}} {m['acc']:8.2f} {m['nll']:8.4f} {m['ece']:8.4f}{ece_mass} {brier}")
    if any(marked.values()):
        lines.append(f"{AT_BOUND} temperature at its search bound ({BOUNDS[0]:g} or {BOUNDS[1]:g}): the validation split "
                     "(dataset.val_size) has no NLL minimum inside it, so these +ts scores are no calibrated fit")
    if len(lines) > 1:
        lines.append(ECE_LEGEND if mass else f"ece: {ECE_BINS} equal-width confidence bins (Guo et al. 2017)")
    return "\n".join(lines)


def mean_loss_and_accuracy(model: nn.Module, loader: Iterable, device: torch.device,
                           loss_fn: Callable = F.cross_entropy,
                           labels: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean loss and accuracy (%) of one network, used for the per-epoch test columns.

    Pass ``labels`` when they are already known, to spare a second pass over the loader."""
    logits = predict_logits(model, loader, device)
    labels = labels_of(loader) if labels is None else labels
    return float(loss_fn(logits, labels)), 100.0 * float(logits.argmax(1).eq(labels).float().mean())


# -- the end of a run: every predictor scored the same way -----------------------------------------------------------
@dataclass
class Evaluation:
    """What the end of a run scored: per predictor its metrics (``metrics.json``: the test set's, and the validation
    split's under ``val``), reliability bins (``reliability.json``) and test log-probabilities (``predictions.pt``),
    and the test labels. With a validation split each predictor ``<name>`` is scored again as ``<name>+ts`` at its
    fitted temperature (``swalab.calibration``)."""

    metrics: dict[str, dict]
    reliability: dict[str, list[dict]]
    log_probs: dict[str, torch.Tensor]
    labels: torch.Tensor

    @property
    def probs(self) -> dict[str, torch.Tensor]:
        return {name: p.exp() for name, p in self.log_probs.items()}


def score_predictors(predictors: dict[str, "Predictor"], test_loader: Iterable, test_labels: torch.Tensor,
                     val_loader: Iterable | None, val_labels: torch.Tensor | None, temperature_scaling: bool | str,
                     describe: Callable[[str], dict]) -> Evaluation:
    """Score every predictor the same way: on the test set, on the validation split when there is one (``val`` in
    its metrics), and, with a temperature fitted there (unless ``temperature_scaling`` is False), again as
    ``<name>+ts``. ``describe(name)`` adds what the method says of a predictor (its budget, its epoch)."""
    log_probs = {name: p.predict_log_proba(test_loader).float() for name, p in predictors.items()}
    val = {}
    if val_loader is not None:
        val = {name: val_log_probs_of(p, val_loader, val_labels, name) for name, p in predictors.items()}
    metrics: dict[str, dict] = {}
    scored: dict[str, torch.Tensor] = {}
    for name, test in log_probs.items():
        described = describe(name)
        metrics[name] = {**metrics_from_log_probs(test, test_labels), **described}
        scored[name] = test
        if val.get(name) is None:
            continue
        metrics[name]["val"] = metrics_from_log_probs(val[name], val_labels)
        if temperature_scaling is False:
            continue
        t = fit_temperature(val[name], val_labels)
        ts = scaled_name(name)
        scored[ts] = scaled(test, t.value)
        metrics[ts] = {**metrics_from_log_probs(scored[ts], test_labels), **described,
                       "temperature": t.value, "temperature_at_bound": t.at_bound,
                       "val": metrics_from_log_probs(scaled(val[name], t.value), val_labels)}
    reliability = {name: reliability_bins(p.exp().cpu(), test_labels.cpu()) for name, p in scored.items()}
    return Evaluation(metrics=metrics, reliability=reliability, log_probs=scored, labels=test_labels.cpu())
