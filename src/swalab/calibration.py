"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017).

When to use it: a predictor whose accuracy is fine but whose confidence is not (NLL and ECE worse than its
accuracy deserves) may only need its logits divided by one number, the temperature ``T``, fitted on data it
never trained on. ``T > 1`` softens an over-confident predictor, ``T < 1`` sharpens an under-confident one; the
arg-max, hence the accuracy, never changes. A run with a validation split (``dataset.val_size``) scores every
predictor ``<name>`` again as ``<name>+ts`` (:data:`SUFFIX`), with its ``T`` fitted on that split.

What is scaled: a predictor's log-probabilities, ``p_T = softmax(log p / T)``. For a single network this is
exactly Guo's ``softmax(z / T)`` of its logits ``z`` (``log p = z - logsumexp(z)``; a constant per image does not
change a softmax). For a predictor that averages probabilities (the FGE ensemble, SWAG's Bayesian model average,
an SWA average scored at a budget mark) the temperature acts on the *average*: ``p_T ∝ (mean_i p_i)^(1/T)``, one
``T`` for the ensemble as a whole, fitted on the ensemble's own validation log-probabilities. That is well
defined whatever the members are, ``T = 1`` gives the ensemble back exactly, and it is the calibration a user of
the ensemble's output can apply: one temperature, fitted on the ensemble's mean log-probabilities.

How ``T`` is fitted: the mean NLL of ``softmax(log p / T)`` on the validation split, minimised over ``log T``
in [log 0.01, log 100] by Brent's bounded search (``scipy.optimize.minimize_scalar``), in float64. The NLL is
convex in ``1/T`` (a log-sum-exp of functions linear in it, minus one linear in it), hence has a single minimum
in ``log T``, which a bracketing 1-D search finds to 1e-6 without a learning rate or a line search, the same
every time. Guo et al.'s code runs LBFGS on ``T`` itself (lr 0.01, 50 iterations), which can step to a
non-positive ``T`` and stops where its iteration budget ends; searching ``log T`` keeps ``T > 0`` by
construction. A validation split the predictor classifies without error has its NLL fall all the way to
``T -> 0`` (until it underflows to 0): no minimum lies inside the bounds, and the fit says so (``at_bound``, in
``metrics.json`` as ``temperature_at_bound``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUFFIX = "+ts"  # predictor <name> scored again at its fitted temperature is <name>+ts
BOUNDS = (0.01, 100.0)  # the temperatures searched


@dataclass(frozen=True)
class Temperature:
    """A fitted temperature: its value, the validation NLL there and at ``T = 1``, and whether it lies at a bound."""

    value: float
    val_nll: float
    val_nll_at_1: float
    at_bound: bool


def nll_at(log_probs: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Mean NLL of ``softmax(log_probs / temperature)`` (float64)."""
    scaled = (log_probs.double() / temperature).log_softmax(dim=1)
    return float(-scaled.gather(1, labels.long().view(-1, 1)).mean())


def fit_temperature(log_probs: torch.Tensor, labels: torch.Tensor) -> Temperature:
    """The temperature that minimises the mean NLL of ``softmax(log_probs / T)`` on ``labels`` (module doc: Brent's
    bounded search on ``log T``). ``log_probs`` are a predictor's log-probabilities on the validation split."""
    from scipy.optimize import minimize_scalar

    if len(labels) == 0 or log_probs.shape[0] != len(labels):
        raise ValueError(f"fit_temperature needs one row of log-probabilities per label: got {tuple(log_probs.shape)} "
                         f"for {len(labels)} labels")
    lp, y = log_probs.double().cpu(), labels.long().cpu()
    lo, hi = math.log(BOUNDS[0]), math.log(BOUNDS[1])
    found = minimize_scalar(lambda log_t: nll_at(lp, y, math.exp(log_t)), bounds=(lo, hi), method="bounded",
                            options={"xatol": 1e-6})
    value = math.exp(float(found.x))
    val_nll = nll_at(lp, y, value)
    # no minimum inside the bounds: the search ends at one, or on a flat stretch as low as a bound's (an NLL that
    # underflows to 0 as T -> 0 on a split classified without error)
    at_bound = (min(abs(found.x - lo), abs(found.x - hi)) < 1e-3
                or min(nll_at(lp, y, BOUNDS[0]), nll_at(lp, y, BOUNDS[1])) <= val_nll)
    return Temperature(value=value, val_nll=val_nll, val_nll_at_1=nll_at(lp, y, 1.0), at_bound=bool(at_bound))


def scaled(log_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(log_probs / temperature)`` as float32: a predictor's log-probabilities at a temperature."""
    return (log_probs.double() / temperature).log_softmax(dim=1).float()


def scaled_name(name: str) -> str:
    """``swa`` -> ``swa+ts``: the predictor scored again at its fitted temperature."""
    return f"{name}{SUFFIX}"


def base_name(name: str) -> tuple[str, bool]:
    """``swa+ts`` -> ``("swa", True)``; ``swa`` -> ``("swa", False)``."""
    return (name[: -len(SUFFIX)], True) if name.endswith(SUFFIX) else (name, False)
