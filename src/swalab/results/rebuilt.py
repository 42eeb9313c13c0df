"""Predictors of a finished run rebuilt for ``python -m swalab.results.score``, beyond the weights it kept: SWAG's
samples and a Laplace posterior, so that ``swag``, ``swag_diag`` and ``laplace`` stand beside SWA, SGD and
temperature scaling on other data (corrupted test sets, OOD detection).

When and why: such a run scores its posterior on its own test split at its end and keeps the predictions, not the
posterior. **SWAG**: the moments (the second moment of the SWA iterates and the last K deviations) are in the method
state of every checkpoint; a finished run deletes its rolling checkpoints unless ``run.keep_finished_checkpoints=true``
kept them. From the kept checkpoint of its last epoch the same Gaussian is rebuilt around the run's SWA average
(``final.pt``), ``samples`` weight vectors are drawn anew (``swalab.methods.swag.draw_weights``, seeded by the run's
seed and the sample's index: not the run's own draws, so on the run's own test split the scores agree with
``metrics.json`` within sampling noise, not to the digit), each sample's BN statistics are recomputed once on the
run's BN-update data, as the run did, and every sample is then scored on each test set asked for. **Laplace**
(``method=laplace``): the fit is deterministic given the run's weights and data (the Kronecker factors summed over
the run's training loader at its epoch-0 order, the prior precision by the same grid search on its validation
split), so it is fitted again, as the run fitted it, and agrees with the run's own ``laplace`` on its test split up
to float summation order."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from swalab.checkpoint import CheckpointStore, read_checkpoint
from swalab.config import ConfigError
from swalab.evaluate import ensemble_log_mean
from swalab.methods.swag import draw_weights, flat_parameters, load_flat

KINDS = {"swag": True, "swag_diag": False}  # predictor -> whether its draw has the low-rank term


@dataclass
class SwagSamples:
    """A finished SWAG run's Gaussian (from the checkpoint ``source``) and the BN statistics of each sample, computed
    on first use and kept for every later test set."""

    mean: torch.Tensor
    sq_mean: torch.Tensor
    deviations: list[torch.Tensor]
    scales: dict[str, float]
    samples: int
    seed: int
    source: str
    bn: dict[tuple[str, int], dict[str, torch.Tensor]] = field(default_factory=dict)

    def describe(self) -> dict:
        """What a score record says of the samples it used."""
        return {"samples": self.samples, "seed": self.seed, "moments_from": self.source,
                "rank": len(self.deviations), "scales": self.scales,
                "note": "drawn anew, not the run's own samples: on its own test split within sampling noise of "
                        "metrics.json"}

    def model(self, base: torch.nn.Module, kind: str, index: int, update_bn) -> torch.nn.Module:
        """Sample ``index`` of ``kind`` (``swag`` or ``swag_diag``) in a copy of ``base``, its BN statistics
        recomputed by ``update_bn`` the first time and restored from then on."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 2 * index + KINDS[kind])
        deviations = self.deviations if KINDS[kind] else []
        model = copy.deepcopy(base)
        load_flat(model, draw_weights(self.mean, self.sq_mean, deviations, self.scales[kind], generator))
        buffers = self.bn.get((kind, index))
        if buffers is None:
            update_bn(model)
            self.bn[(kind, index)] = {k: b.detach().clone() for k, b in model.named_buffers()}
        else:
            model.load_state_dict(buffers, strict=False)
        return model

    def log_probs(self, base: torch.nn.Module, kind: str, update_bn, predict) -> torch.Tensor:
        """The Bayesian model average of ``kind``: the mean of the samples' probabilities under ``predict``."""
        return ensemble_log_mean([predict(self.model(base, kind, i, update_bn)) for i in range(self.samples)])


def last_epoch_moments(run) -> tuple[dict, str] | str:
    """The method state of the kept checkpoint of ``run``'s last epoch and its name, or why there is none."""
    last = int(run.cfg.trainer.epochs)
    kept = dict(CheckpointStore(run.path).kept())
    if last not in kept:
        return ("SWAG's moments are kept only in the checkpoint of its last epoch, which a finished run deletes: "
                "train it again with run.keep_finished_checkpoints=true to score swag and swag_diag again, in a "
                "directory of its own (run.dir=<dir>) or after moving this run away: the same command skips it")
    state = read_checkpoint(kept[last])
    method = state.get("method") or {}
    if method.get("sq_mean") is None:
        return f"{kept[last]} holds no SWAG moments (its method captured no model)"
    return method, str(kept[last].relative_to(run.path))


def samples_drawn(run, asked: int | None = None) -> int | None:
    """How many SWAG samples scoring ``run`` draws: ``asked`` (``--swag-samples``), else the run's own
    ``method.samples``; None for a run of another method, which draws none (a score record says what it was made
    from by it, ``swalab.results.score.scoring_inputs``)."""
    if run.method != "swag":
        return None
    return int(asked or run.get("method.samples"))


def swag_samples(run, swa_model: torch.nn.Module, samples: int | None = None) -> SwagSamples | str:
    """The samples of a finished SWAG ``run`` around ``swa_model`` (its average, from ``final.pt``), ``samples`` of
    them (default: the run's ``method.samples``), or why they cannot be drawn."""
    found = last_epoch_moments(run)
    if isinstance(found, str):
        return found
    method, source = found
    scale = float(run.get("method.scale"))
    return SwagSamples(mean=flat_parameters(swa_model, "cpu"), sq_mean=method["sq_mean"].float().cpu(),
                       deviations=[d.float().cpu() for d in method.get("deviations") or []],
                       scales={"swag": scale, "swag_diag": float(run.get("method.diag_scale", scale))},
                       samples=samples_drawn(run, samples), seed=int(run.get("seed", 0)),
                       source=source)


@dataclass
class Rebuilt:
    """What :func:`rebuild` made of one run: ``predict(other)`` gives the rebuilt predictors' log-probabilities on
    ``other`` (a ``Scored`` reading another test set), ``why_not`` why predictors of a kind could not be rebuilt
    (``{name prefix: reason}``), ``record`` what a score record says of them."""

    predict: object = None
    why_not: dict[str, str] = field(default_factory=dict)
    record: dict = field(default_factory=dict)

    def log_probs(self, other) -> dict[str, torch.Tensor]:
        return self.predict(other) if self.predict is not None else {}


def rebuild(scored, swag_sample_count: int | None = None) -> Rebuilt:
    """The rebuilt predictors of ``scored``'s run (a ``swalab.results.compare.Scored``): SWAG's samples of a SWAG run,
    the Laplace posterior of a ``method=laplace`` run, nothing for any other."""
    run = scored.run
    if run.method == "swag":
        swa = scored.model_for(run.weights("swa"), f"{run.path}/final.pt[swa]")
        samples = swag_samples(run, swa, swag_sample_count)
        if isinstance(samples, str):
            return Rebuilt(why_not={"swag": samples})
        return Rebuilt(predict=lambda other: {kind: samples.log_probs(swa, kind, scored.update_bn, other.log_probs)
                                              for kind in KINDS},
                       record={"swag_samples": samples.describe()})
    if run.method == "laplace":
        return laplace_again(scored)
    return Rebuilt()


def laplace_again(scored) -> Rebuilt:
    """A ``method=laplace`` run's posterior fitted again around its weights (module doc)."""
    from swalab.methods.laplace import LOG_PRIOR_RANGE, LaplacePredictor, chosen_prior, fit_laplace

    run = scored.run
    if scored.val_loader is None:  # a laplace run always has one: it refuses to run without
        raise ConfigError(f"{run.path}: a Laplace run without a validation split cannot be fitted again")
    train, _, _ = run.loaders(run.data(), scored.device)
    method = run.cfg.method
    hessian, link = str(method.get("hessian", "kron")), str(method.get("link", "probit"))
    weights = str(method.get("weights", "last_layer"))
    chosen, where = earlier_prior(run, hessian, link)
    la = fit_laplace(scored.model, train, scored.val_loader, hessian, link, int(method.get("grid_size", 100)), chosen,
                     prior_range=tuple(method.get("prior_range") or LOG_PRIOR_RANGE), weights=weights)
    predictor = LaplacePredictor(la, scored.device, link, weights)
    return Rebuilt(predict=lambda other: {"laplace": predictor.predict_log_proba(other.test_loader)},
                   record={"laplace": {"refitted": True, "weights": weights, "hessian": hessian, "link": link,
                                       "prior_precision": chosen_prior(la),
                                       "prior_precision_from": where}})


def earlier_prior(run, hessian: str, link: str) -> tuple[list[float] | None, str]:
    """The prior precision an earlier refit of ``run`` chose on its validation split (a score record of the same
    Hessian structure and link), and where it was read: the grid search costs ``method.grid_size`` passes over the
    validation split (about 10 minutes of a 2-core CPU for a PreResNet-20 and 5,000 images), for a choice already made
    on that split; the Hessian is still fitted again. ``(None, "grid search on the validation split")`` when there is
    none."""
    for name, record in sorted(run.scores.items()):
        fitted = (record or {}).get("laplace") or {}
        if fitted.get("hessian") == hessian and fitted.get("link") == link and fitted.get("prior_precision"):
            return [float(v) for v in fitted["prior_precision"]], f"an earlier refit's grid search (scores/{name})"
    return None, "grid search on the validation split"
