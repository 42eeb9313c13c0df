"""A last-layer (or all-layer) Laplace approximation on a finished run's weights (laplace-torch): the post-hoc
rival of SWAG.

``method=laplace`` (``conf/method/laplace.yaml``) trains nothing. It starts from a finished run's weights
(``model.init_from=<SGD run dir>``), fits a Gaussian posterior over the last linear layer
(``method.weights=last_layer``) or over every convolution and linear layer (``method.weights=all``: laplace-torch's
``subset_of_weights="all"``; the BatchNorm scales and shifts are held at their loaded values, for curvlinops'
Kronecker factors cover only linear and convolution layers) with the Hessian (GGN) structure ``method.hessian`` on the
training loader, chooses the prior precision by a grid search of the validation split's NLL (``dataset.val_size``;
``method.grid_size`` points log-spaced over ``method.prior_range``, 10^-4 .. 10^4 by default, laplace-torch's ``optimize_prior_precision(method="gridsearch")``) and predicts with the linearised (GLM) predictive under the
link approximation ``method.link`` (``probit``: Daxberger et al. 2021's default). Predictors: ``laplace`` and
``map`` (the weights as loaded), scored by the same evaluator as every other method's, with ``+ts`` where the run
fits temperatures; the chosen prior precision is recorded with the ``laplace`` predictor's metrics
(``prior_precision``), and a choice at either end of the grid is said in run.log: the best prior may lie beyond it
(at the top, the posterior is so narrow that the predictive is the MAP's), and ``method.prior_range`` widens it. The library (PyPI ``laplace-torch``, the extra ``swalab[laplace]``) is imported only here, when
the method runs."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Iterable, Sequence

import torch
from torch import nn

from swalab.config import ConfigError, require
from swalab.logs import get_logger
from swalab.evaluate import ModelPredictor, Predictor
from swalab.precision import scoring_precision
from swalab.methods.base import TrainContext
from swalab.methods.pretrained import Pretrained

HESSIANS = ("kron", "diag", "full")
WEIGHTS = ("last_layer", "all")  # method.weights: laplace-torch's subset_of_weights
CURVED = (nn.Linear, nn.Conv2d)  # the layers whose weights method.weights=all puts under the posterior
ALL_LAYER_CHUNK = 8  # images per Jacobian of the all-layer predictive: (images x classes x weights) numbers at once
LINKS = ("probit", "bridge", "mc")
LOG_PRIOR_RANGE = (-4, 4)  # the grid of prior precisions, 10^-4 .. 10^4 (laplace-torch's default)


class Sized:
    """A loader of (x, y) batches as laplace-torch reads one: it needs ``len(loader.dataset)``, the image count."""

    def __init__(self, loader: Iterable, images: int):
        self.loader, self.dataset = loader, range(images)

    def __iter__(self):
        return iter(self.loader)


class Chunked(Sized):
    """The same batches cut into pieces of at most ``size`` images: the all-layer predictive holds the Jacobian of
    every image of a batch over every weight."""

    def __init__(self, loader: Iterable, images: int, size: int = ALL_LAYER_CHUNK):
        super().__init__(loader, images)
        self.size = size

    def __iter__(self):
        for x, y in self.loader:
            yield from zip(x.split(self.size), y.split(self.size))


def count(loader: Iterable) -> int:
    """The images a loader yields (its ``labels`` when it knows them, else one pass)."""
    labels = getattr(loader, "labels", None)
    return len(labels) if labels is not None else sum(len(y) for _, y in loader)


def require_laplace_torch() -> None:
    """Refuse ``method=laplace`` in one line when laplace-torch is not installed (an extra): when the method is built,
    before a run writes anything, and before ``results.score`` fits a run's posterior again."""
    if importlib.util.find_spec("laplace") is None:
        raise ConfigError("method=laplace needs PyPI's laplace-torch, which is not installed: "
                          "pip install 'swalab[laplace]'")


def fit_laplace(model: nn.Module, train: Iterable, val: Iterable, hessian: str = "kron", link: str = "probit",
                grid_size: int = 100, prior_precision: Sequence[float] | None = None,
                prior_range: Sequence[float] = LOG_PRIOR_RANGE, weights: str = "last_layer"):
    """laplace-torch's Laplace of ``model``'s ``weights`` (last_layer, or all: every linear and convolution layer, the
    others' parameters held as they are, their ``requires_grad`` turned off) fitted on ``train``, its prior precision chosen on ``val`` (a
    grid search: ``grid_size`` passes over the validation split, log-spaced over 10^``prior_range``), or
    ``prior_precision`` when one was chosen before. A choice at an end of the grid is logged (:func:`at_grid_edge`)."""
    require_laplace_torch()
    from laplace import Laplace

    model.eval()
    for p in model.parameters():  # laplace-torch flattens them with view(): weights read from a file may be strided
        if not p.is_contiguous():
            p.data = p.data.contiguous()
    if weights == "all":
        for module in model.modules():  # curvlinops' KFAC refuses parameters of other layers (BatchNorm's)
            if not isinstance(module, CURVED):
                for p in module.parameters(recurse=False):
                    p.requires_grad_(False)
    la = Laplace(model, "classification", subset_of_weights=weights, hessian_structure=hessian)
    la.fit(Sized(train, count(train)))
    if prior_precision is not None:
        la.prior_precision = torch.as_tensor(list(prior_precision), dtype=torch.float32).reshape(-1)
        return la
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*link_approx.*")  # the library reminds that we pass the same
        la.optimize_prior_precision(method="gridsearch", pred_type="glm", link_approx=link,
                                    val_loader=(Chunked if weights == "all" else Sized)(val, count(val)),
                                    log_prior_prec_min=prior_range[0], log_prior_prec_max=prior_range[1],
                                    grid_size=grid_size)
    edge = at_grid_edge(chosen_prior(la), prior_range)
    if edge:
        get_logger().warning(f"[swalab] method=laplace: {edge}")
    return la


def chosen_prior(la) -> list[float]:
    """The prior precision of a fitted Laplace approximation, as a list (one value, or one per layer)."""
    return [float(v) for v in torch.as_tensor(la.prior_precision).reshape(-1)]


def at_grid_edge(prior: Sequence[float], prior_range: Sequence[float]) -> str | None:
    """What to say when the prior precision chosen on the validation split lies at an end of the searched grid
    (10^``prior_range``): the best one may lie beyond it. None inside the grid."""
    low, high = (10.0 ** float(e) for e in prior_range)
    top, bottom = max(prior), min(prior)
    if top >= high * (1 - 1e-4):
        return (f"the prior precision chosen on the validation split, {top:.3g}, is the top of the grid searched "
                f"(10^{prior_range[1]:g}): the validation NLL favours a yet narrower posterior, whose predictive tends "
                f"to the MAP's; method.prior_range=[{prior_range[0]:g},{float(prior_range[1]) + 4:g}] searches further")
    if bottom <= low * (1 + 1e-4):
        return (f"the prior precision chosen on the validation split, {bottom:.3g}, is the bottom of the grid searched "
                f"(10^{prior_range[0]:g}); method.prior_range=[{float(prior_range[0]) - 4:g},{prior_range[1]:g}] "
                "searches further")
    return None


class LaplacePredictor:
    """A fitted Laplace approximation as a predictor: the log of its GLM predictive under ``link`` (of ``weights``
    all: ``ALL_LAYER_CHUNK`` images at a time)."""

    def __init__(self, la, device: torch.device, link: str = "probit", weights: str = "last_layer"):
        self.la, self.device, self.link = la, device, link
        self.chunk = ALL_LAYER_CHUNK if weights == "all" else None

    @torch.no_grad()
    def predict_log_proba(self, loader: Iterable) -> torch.Tensor:
        out = []
        with scoring_precision(self.device):
            for x, _ in loader:
                for piece in x.split(self.chunk or len(x)):
                    probs = self.la(piece.to(self.device).float(), pred_type="glm", link_approx=self.link)
                    out.append(probs.float().cpu())
        return torch.cat(out).clamp_min(torch.finfo(torch.float32).tiny).log()


class LaplaceMethod(Pretrained):
    """No training step; predictors ``map`` (the loaded weights) and ``laplace`` (a Laplace of ``method.weights`` on
    them)."""

    name = "laplace"
    live = "map"  # the loaded weights are the posterior's mode
    needs_validation_split = "fits its prior precision on the validation split"

    def __init__(self, schedule=None, epochs: int = 0, budget: float = 0.0, name: str | None = None,
                 hessian: str = "kron", link: str = "probit", grid_size: int = 100,
                 prior_range: Sequence[float] = LOG_PRIOR_RANGE, weights: str = "last_layer"):
        super().__init__(schedule, 0, budget, name)
        require_laplace_torch()
        if hessian not in HESSIANS:
            raise ConfigError(f"method.hessian={hessian}: give one of {', '.join(HESSIANS)}")
        if weights not in WEIGHTS:
            raise ConfigError(f"method.weights={weights}: give one of {', '.join(WEIGHTS)}")
        if weights == "all" and hessian == "full":
            raise ConfigError("method.weights=all with method.hessian=full: a dense Hessian over every weight (the "
                              "square of their count) cannot be held; give method.hessian=kron or diag")
        if link not in LINKS:
            raise ConfigError(f"method.link={link}: give one of {', '.join(LINKS)}")
        if int(grid_size) < 2:
            raise ConfigError(f"method.grid_size={grid_size}: give 2 or more prior precisions to search")
        require("method.prior_range", prior_range, "numbers", -30, 30)
        if len(prior_range) != 2 or not float(prior_range[0]) < float(prior_range[1]):
            raise ConfigError(f"method.prior_range={list(prior_range)}: give [low, high], the base-10 logarithms of "
                              "the smallest and largest prior precision searched, low < high (e.g. [-4,4])")
        self.hessian, self.link, self.grid_size, self.weights = hessian, link, int(grid_size), weights
        self.prior_range = tuple(float(v) for v in prior_range)
        self.prior: list[float] | None = None  # chosen on the validation split once the posterior is fitted

    def validate(self, initialized: bool) -> None:
        if not initialized:
            raise ConfigError("method=laplace fits a posterior around trained weights, but they are a random "
                              "initialisation: set model.init_from=<a finished SGD run's directory>")

    def on_train_start(self, ctx: TrainContext) -> None:
        if ctx.val_data is None:  # a run is refused before it starts (swalab.train.plan.validate); a Python caller here
            raise ConfigError(f"method={self.name} {self.needs_validation_split}, and this run has none: set "
                              "dataset.val_size (e.g. dataset.val_size=5000), as the source run did or not")

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        la = fit_laplace(ctx.model, ctx.train_data, ctx.val_data, self.hessian, self.link, self.grid_size,
                         prior_range=self.prior_range, weights=self.weights)
        self.prior = chosen_prior(la)
        return {self.live: ModelPredictor(ctx.model, ctx.device),
                "laplace": LaplacePredictor(la, ctx.device, self.link, self.weights)}

    def describe(self, predictor: str) -> dict:
        """The ``laplace`` predictor's metrics carry the prior precision chosen for it (a list: one value, or one per
        layer)."""
        described = super().describe(predictor)
        return {**described, "prior_precision": self.prior} if predictor == "laplace" and self.prior else described
