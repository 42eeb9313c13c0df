"""SWA-Gaussian (Maddox et al., NeurIPS 2019, "A Simple Baseline for Bayesian Uncertainty in Deep Learning").

SWAG trains exactly as SWA does (the same schedule, the same captures, ``model.swa``), and keeps, beside
the average, what a Gaussian over the SWA iterates needs: the running mean of the squared weights (a
diagonal covariance, ``var = E[w^2] - E[w]^2``, clamped at ``1e-30`` as the authors' code does) and the
deviations ``D_i = w_i - mean_i`` of the last ``rank`` captures (a low-rank covariance; K = 20 in the
paper). At test time it draws ``samples`` weight vectors (S = 30 in the paper),

    w = mean + sqrt(scale) * (sqrt(var) * z1 + D^T z2 / sqrt(K - 1)),   z1 ~ N(0, I_d), z2 ~ N(0, I_K),

recomputes each sample's BatchNorm statistics on the training data, and averages the samples' class
probabilities (Bayesian model averaging). ``scale = 0.5`` is the paper's covariance
``1/2 (Sigma_diag + D D^T / (K - 1))``; the authors' code multiplies the draw by ``sqrt(scale)`` the same
way. SWAG-diagonal (``swag_diag``) drops the ``D`` term and has a scale of its own, ``diag_scale``: the
paper defines it as N(theta_SWA, Sigma_diag) and the authors' experiments sample it at scale 1.0, the
default (until ``method.diag_scale`` existed it was sampled at ``scale``, half that variance;
``swalab.compat`` reads such a run as holding ``diag_scale = scale``). With a scale of 0 every sample is
the SWA average itself.

Predictors: ``swag`` and ``swag_diag`` (each the mean of ``samples`` samples' probabilities), ``swa`` (the
average, as an SWA run of this config scores it) and ``sgd`` (the last iterate): one run gives SWA and
SWAG together. Memory: the moments take ``(2 + rank)`` copies of the parameters, on
``moments_device`` (``cpu`` keeps WRN-28-10's 36.5M x 22 x 4 bytes = 3.2 GB off the GPU); a draw adds three
vectors of the parameters' size (the variance, the noise, the draw), never a second copy of the deviations
(``bench/swag_cost.py`` computes both per model)."""

from __future__ import annotations

import copy
from collections import deque

import torch
from torch import nn

from swalab import distributed
from swalab.config import ConfigError, require
from swalab.evaluate import CachedEnsemble, Predictor
from swalab.methods.base import TrainContext
from swalab.methods.swa import SWA
from swalab.schedules import Schedule

VAR_CLAMP = 1e-30


def flat_parameters(model: nn.Module, device: torch.device | str) -> torch.Tensor:
    """All parameters of ``model`` as one float32 vector on ``device`` (buffers left out: BN statistics are
    recomputed for every sample)."""
    return torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in model.parameters()])


def load_flat(model: nn.Module, vector: torch.Tensor) -> None:
    """Write ``vector`` (as :func:`flat_parameters` made it) into ``model``'s parameters."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(vector[offset:offset + n].view_as(p).to(p.device, p.dtype))
            offset += n


def draw_weights(mean: torch.Tensor, sq_mean: torch.Tensor, deviations, scale: float,
                 generator: torch.Generator) -> torch.Tensor:
    """One weight vector from the Gaussian of the module doc: ``mean + sqrt(scale) (sqrt(var) z1 + D^T z2 / sqrt(K - 1))``
    with the low-rank term only when ``deviations`` holds two or more (none: SWAG-diagonal). Shared by a training
    run's samples and ``swalab.results.rebuilt``, which draws them again for a finished run."""
    var = (sq_mean.to(mean.device) - mean * mean).clamp_min(VAR_CLAMP)
    z1 = torch.randn(mean.shape, generator=generator).to(mean.device)
    draw = var.sqrt() * z1
    k = len(deviations)
    if k > 1:
        z2 = torch.randn(k, generator=generator)
        for z, deviation in zip(z2.tolist(), deviations):  # D^T z2 without a stacked K x d copy of D
            draw.add_(deviation.to(mean.device), alpha=z / (k - 1) ** 0.5)
    return mean + scale ** 0.5 * draw


class SWAG(SWA):
    """SWAG (module doc): SWA's training and captures (its ``method.*`` keys, read from ``model.swa``), and its own
    settings."""

    name = "swag"
    columns = ("swag", "swag_diag")
    stands_in = ("swa",)  # its ``swa`` and ``swa@<b>`` are the SWA average of the same training (model.swa)

    def __init__(self, schedule: Schedule, epochs: int, lr: float, rank: int = 20, samples: int = 30,
                 scale: float = 0.5, diag_scale: float = 1.0, moments_device: str = "cpu", **swa):
        super().__init__(schedule, epochs, lr, **swa)
        self.rank = require("method.rank", rank, "int", 2)
        self.samples = require("method.samples", samples, "int", 1)
        self.scale = float(require("method.scale", scale, "number", 0))
        self.diag_scale = float(require("method.diag_scale", diag_scale, "number", 0))
        self.moments_device = moments_device
        self.sq_mean: torch.Tensor | None = None
        self.deviations: deque[torch.Tensor] = deque(maxlen=self.rank)

    def validate(self, initialized: bool) -> None:
        super().validate(initialized)
        if self.moments_device not in ("cpu", "train"):
            raise ConfigError(f"method.moments_device={self.moments_device!r} must be 'cpu' or 'train' (the training "
                              "device)")

    def caveats(self) -> list[str]:
        """SWA's, and a rank above the captures the run makes, which keeps only those (the paper's K = 20 needs 20 captures): said at
        launch, not refused, since the default rank meets short runs (a grid's, the quickstart's) as well."""
        captured = self.captures_by(self.epochs)
        if self.rank <= captured:
            return super().caveats()
        return [*super().caveats(), f"method.rank={self.rank} but the run captures {captured} models ({self.spacing()}): the low-rank "
                f"covariance holds {captured} deviations (rank {captured} in metrics.json). Lower method.rank to "
                f"{captured}, or capture more (an earlier method.start, a longer run)"]

    def _device(self, ctx: TrainContext) -> torch.device:
        return torch.device("cpu") if self.moments_device == "cpu" else ctx.device

    # -- capture: SWA's average, plus the second moment and the deviations --------------------------
    def capture(self, ctx: TrainContext) -> None:
        super().capture(ctx)
        n = self.n_averaged  # captures so far, this one included
        w = flat_parameters(ctx.model, self._device(ctx))
        mean = flat_parameters(self.averaged.module, w.device)
        self.sq_mean = w * w if self.sq_mean is None else self.sq_mean + (w * w - self.sq_mean) / n
        self.deviations.append(w - mean)

    # -- sampling ---------------------------------------------------------------------------------
    def sample(self, mean: torch.Tensor, generator: torch.Generator, low_rank: bool) -> torch.Tensor:
        """One draw of the weights (module doc); ``low_rank=False`` is SWAG-diagonal, drawn at ``diag_scale``."""
        return draw_weights(mean, self.sq_mean, self.deviations if low_rank else (),
                            self.scale if low_rank else self.diag_scale, generator)

    def sampled_log_probs(self, ctx: TrainContext, low_rank: bool, generator: torch.Generator) -> CachedEnsemble:
        """The test log-probabilities of ``samples`` draws, each with its BN statistics recomputed (on the training
        split), and the same draws' on the validation split when there is one: the Bayesian model average is an
        ensemble of the samples, scored and temperature-scaled as one predictor (``swalab.calibration``)."""
        base = self.averaged.module
        mean = flat_parameters(base, self._device(ctx))
        model = copy.deepcopy(base)
        members = CachedEnsemble()
        for _ in range(self.samples):
            load_flat(model, self.sample(mean, generator, low_rank))
            ctx.update_bn(model)
            members.add(ctx.test_log_probs(model), ctx.val_log_probs(model) if ctx.val_log_probs is not None else None)
        return members

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        if self.sq_mean is None:
            raise RuntimeError("SWAG has captured no model yet: check method.start and trainer.epochs")
        out = super().predictors(ctx)
        # one draw from torch's RNG (restored on a resume) seeds the samples: a run and its resume sample alike; under
        # data parallelism rank 0's draw, so that every rank scores the same samples (each rank has its own stream)
        generator = torch.Generator().manual_seed(distributed.from_rank_0(int(torch.randint(0, 2**62, (1,)))))
        out["swag"] = self.sampled_log_probs(ctx, low_rank=True, generator=generator)
        out["swag_diag"] = self.sampled_log_probs(ctx, low_rank=False, generator=generator)
        return out

    def describe(self, predictor: str) -> dict[str, float]:
        return super().describe("swa" if predictor.startswith("swag") else predictor)

    def extra_metrics(self, ctx: TrainContext, labels: torch.Tensor) -> dict[str, dict]:
        common = {"n_averaged": self.n_averaged, "samples": self.samples}
        return {**super().extra_metrics(ctx, labels),
                "swag": {**common, "scale": self.scale, "rank": len(self.deviations)},
                "swag_diag": {**common, "scale": self.diag_scale}}

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "sq_mean": self.sq_mean, "deviations": list(self.deviations)}

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        """The moments go back to ``moments_device``: a checkpoint is read onto the CPU, and with
        ``moments_device=train`` on a GPU the next capture would otherwise mix the two devices."""
        super().load_state_dict(state, ctx)
        device = self._device(ctx)
        sq_mean = state.get("sq_mean")
        self.sq_mean = None if sq_mean is None else sq_mean.to(device)
        self.deviations = deque((d.to(device) for d in state.get("deviations") or []), maxlen=self.rank)
