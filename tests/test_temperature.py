"""Temperature scaling on the validation split (Guo et al. 2017): every predictor, single network or ensemble, scored
again as ``<name>+ts`` at the temperature that minimises its validation NLL."""

from __future__ import annotations

import math

import pytest
import torch

from swalab.calibration import fit_temperature, nll_at, scaled
from swalab.data import ResidentLoader
from swalab.evaluate import CachedEnsemble, CachedLogProbs, ensemble_log_mean, metrics_from_log_probs
from swalab.methods import FGE, SGD, SWA, SWAG
from swalab.methods.base import Method
from swalab.schedules import PaperSGD
from swalab.trainer import Trainer, TrainerOptions

from test_methods import CPU, split, toy_net


pytestmark = pytest.mark.usefixtures("one_thread")  # toy models gain nothing from threads, lose on a busy machine


# -- the fit ---------------------------------------------------------------------------------------------------------
def overconfident(n: int, classes: int, true_t: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of a predictor whose labels are drawn from ``softmax(z / true_t)`` but which says
    ``softmax(z)``: temperature scaling should find ``true_t``."""
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, classes, generator=g)
    labels = torch.multinomial((z / true_t).softmax(dim=1), 1, generator=g).squeeze(1)
    return z.log_softmax(dim=1), labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_at(true_t):
    log_probs, labels = overconfident(40000, 5, true_t)
    fitted = fit_temperature(log_probs, labels)
    assert fitted.value == pytest.approx(true_t, rel=0.05) and not fitted.at_bound
    assert fitted.val_nll <= fitted.val_nll_at_1 + 1e-12


def test_the_fit_is_the_global_minimum_of_the_validation_nll():
    log_probs, labels = overconfident(3000, 10, 1.7, seed=1)
    fitted = fit_temperature(log_probs, labels)
    grid = [math.exp(x / 50) for x in range(-230, 231)]  # every temperature in [0.01, 100], 2% apart
    assert fitted.val_nll <= min(nll_at(log_probs, labels, t) for t in grid) + 1e-9
    assert fitted.val_nll == pytest.approx(nll_at(log_probs, labels, fitted.value))


def test_scaling_keeps_every_prediction_and_the_accuracy():
    log_probs, labels = overconfident(500, 7, 2.0)
    for t in (0.3, 1.0, 4.0):
        out = scaled(log_probs, t)
        assert torch.equal(out.argmax(1), log_probs.argmax(1))
        torch.testing.assert_close(out.exp().sum(1), torch.ones(500))
    torch.testing.assert_close(scaled(log_probs, 1.0), log_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(scaled(log_probs, 2.0), (log_probs / 2).log_softmax(1), rtol=0, atol=1e-6)


def test_a_validation_split_classified_without_error_sends_the_temperature_to_its_bound():
    labels = torch.arange(20) % 4
    log_probs = torch.nn.functional.one_hot(labels, 4).float().mul(5).log_softmax(1)
    fitted = fit_temperature(log_probs, labels)
    assert fitted.at_bound and fitted.value < 0.1 and fitted.val_nll < 1e-12  # the NLL falls all the way to T -> 0
    assert not fit_temperature(*overconfident(1000, 4, 2.0)).at_bound


def test_the_end_of_run_table_marks_a_temperature_fitted_to_its_search_bound_and_says_why_below():
    from swalab.evaluate import metrics_table

    scores = {"acc": 90.0, "nll": 0.3, "ece": 0.02, "brier": 0.15}
    metrics = {"swa": scores, "swa+ts": {**scores, "nll": 10.9, "temperature": 0.011, "temperature_at_bound": True},
               "sgd": scores, "sgd+ts": {**scores, "temperature": 1.4, "temperature_at_bound": False}}
    lines = metrics_table(metrics).splitlines()
    assert [line.split()[0] for line in lines[1:5]] == ["swa", "swa+ts*", "sgd", "sgd+ts"]
    assert lines[5] == ("* temperature at its search bound (0.01 or 100): the validation split (dataset.val_size) has "
                        "no NLL minimum inside it, so these +ts scores are no calibrated fit")
    assert "*" not in metrics_table({"swa": scores, "sgd+ts": metrics["sgd+ts"]})


# -- in a run --------------------------------------------------------------------------------------------------------
def val_trainer(method, tmp_path, epochs: int, val: bool = True, **options) -> Trainer:
    """A tiny run on random data with a validation split of 15 images (``val=False``: none)."""
    common = dict(device=CPU, mean=[0.5, 0.5], std=[0.25, 0.25])
    train_split = split(48, seed=1)
    opts = TrainerOptions(**{"epochs": epochs, "progress": False, "handle_signals": False, "eval_every": 0,
                             "checkpoint_every": 1000, **options})
    return Trainer(toy_net(), method,
                   ResidentLoader(train_split, 8, train=True, pad=1, flip=True, seed=0, **common),
                   ResidentLoader(split(20, seed=2), 7, train=False, **common),
                   ResidentLoader(train_split, 8, train=True, pad=1, flip=True, drop_last=False, seed=1, **common),
                   CPU, tmp_path, opts, val_loader=ResidentLoader(split(15, seed=3), 6, train=False, **common)
                   if val else None)


def swa():
    return SWA(PaperSGD(lr=0.1, horizon=6), 6, lr=0.05, start_epoch=2, pre_schedule="base", score_at_budgets=[1.0],
               budget=1.5)


def test_every_predictor_is_scored_on_both_splits_and_again_at_its_fitted_temperature(tmp_path):
    trainer = val_trainer(swa(), tmp_path, epochs=6)
    metrics = trainer.fit().metrics
    assert list(metrics) == ["swa@1", "swa@1+ts", "swa", "swa+ts", "sgd", "sgd+ts"]
    val = trainer.val_log_probs(trainer.method.averaged.module)  # the SWA average, as it was scored
    fitted = fit_temperature(val, trainer.val_labels)
    assert metrics["swa+ts"]["temperature"] == fitted.value
    expected = metrics_from_log_probs(scaled(trainer.test_log_probs(trainer.method.averaged.module), fitted.value),
                                      trainer.test_labels)
    assert metrics["swa+ts"]["nll"] == pytest.approx(expected["nll"]) and metrics["swa+ts"]["acc"] == metrics["swa"]["acc"]
    assert metrics["swa+ts"]["val"]["nll"] == pytest.approx(fitted.val_nll, rel=1e-5)
    assert metrics["swa"]["val"]["nll"] == pytest.approx(fitted.val_nll_at_1, rel=1e-5)
    assert metrics["swa@1+ts"]["budget"] == 1.0 and metrics["swa+ts"]["budget"] == 1.5  # what stands behind it
    assert metrics["swa@1"]["val"]["acc"] != metrics["swa"]["val"]["acc"] or metrics["swa@1"]["val"]["nll"] != \
        metrics["swa"]["val"]["nll"]  # the budget mark was scored on the validation split at its own epoch


def test_without_a_validation_split_a_run_scores_as_before(tmp_path):
    metrics = val_trainer(swa(), tmp_path, epochs=6, val=False).fit().metrics
    assert list(metrics) == ["swa@1", "swa", "sgd"] and not any("val" in m for m in metrics.values())


def test_temperature_scaling_false_keeps_the_validation_scores_only(tmp_path):
    metrics = val_trainer(SGD(PaperSGD(lr=0.1, horizon=2), 2), tmp_path, epochs=2,
                          temperature_scaling=False).fit().metrics
    assert list(metrics) == ["sgd"] and "val" in metrics["sgd"]


def test_the_fge_ensemble_is_scaled_as_a_whole_with_a_temperature_fitted_on_its_own_validation_log_probs(tmp_path):
    method = fge()
    trainer = val_trainer(method, tmp_path, epochs=8)
    metrics = trainer.fit().metrics
    members = method.ensemble
    assert len(members.member_val_log_probs) == len(members) == 3
    ensemble_val = ensemble_log_mean(members.member_val_log_probs)  # log of the members' mean probability
    assert metrics["fge+ts"]["temperature"] == fit_temperature(ensemble_val, trainer.val_labels).value
    assert metrics["fge"]["val"]["nll"] == pytest.approx(metrics_from_log_probs(ensemble_val, trainer.val_labels)["nll"])


def fge():
    return FGE(PaperSGD(lr=0.1, horizon=8), 8, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=2)


@pytest.mark.parametrize("method, stop", [(fge, 5), (lambda: SWA(PaperSGD(lr=0.1, horizon=8), 8, lr=0.05, start_epoch=2,
                                                                 pre_schedule="base", score_at_budgets=[0.75]), 7)])
def test_a_run_resumes_with_the_validation_scores_it_kept(tmp_path, method, stop):
    """FGE's members and SWA's budget marks were scored on the validation split when they were taken: a run killed
    after that (epoch ``stop``) ends as the run trained straight through."""
    straight = val_trainer(method(), tmp_path / "straight", epochs=8).fit().metrics
    first = val_trainer(method(), tmp_path / "paused", epochs=8)
    first.opts.epochs = stop
    first.fit()
    resumed = val_trainer(method(), tmp_path / "paused", epochs=8)
    assert resumed.fit(first.store.latest()).metrics == straight


def test_swag_scales_its_model_average_with_one_temperature_over_its_samples(tmp_path):
    swag = SWAG(PaperSGD(lr=0.1, horizon=6), 6, lr=0.05, start_epoch=2, pre_schedule="base", samples=3)
    trainer = val_trainer(swag, tmp_path, epochs=6)
    seen = []
    real = swag.sampled_log_probs
    swag.sampled_log_probs = lambda ctx, low_rank, generator: seen.append(real(ctx, low_rank, generator)) or seen[-1]
    metrics = trainer.fit().metrics
    bma = seen[0]  # swag's samples, in the order predictors() drew them
    assert len(bma.member_val_log_probs) == 3
    assert metrics["swag+ts"]["temperature"] == fit_temperature(bma.val_log_proba(), trainer.val_labels).value
    assert {"swag+ts", "swag_diag+ts", "swa+ts", "sgd+ts"} <= set(metrics)


class Cached(Method):
    """A method of one's own whose predictor was computed once on the test set and says nothing of the rest."""

    def predictors(self, ctx):
        class TestOnly:
            def __init__(self, log_probs):
                self.log_probs = log_probs

            def predict_log_proba(self, loader):
                return self.log_probs

        return {"cached": TestOnly(ctx.test_log_probs(ctx.model)),
                "said": CachedLogProbs(ctx.test_log_probs(ctx.model)),  # it knows nothing of the validation split
                "ensemble": CachedEnsemble([ctx.test_log_probs(ctx.model)])}


def test_a_predictor_that_ignores_the_validation_loader_is_refused_not_scored_on_the_wrong_images(tmp_path):
    with pytest.raises(RuntimeError, match="predictor 'cached' gave 20 rows for the 15 validation images"):
        val_trainer(Cached(PaperSGD(lr=0.1, horizon=1), 1), tmp_path, epochs=1).fit()


def test_cached_predictors_that_know_no_validation_scores_get_no_temperature(tmp_path):
    method = Cached(PaperSGD(lr=0.1, horizon=1), 1)
    method.predictors = lambda ctx, real=method.predictors: {k: v for k, v in real(ctx).items() if k != "cached"}
    metrics = val_trainer(method, tmp_path, epochs=1).fit().metrics
    assert list(metrics) == ["said", "ensemble"] and not any("val" in m for m in metrics.values())


def test_monitoring_on_the_validation_split_scores_the_live_model_and_the_swa_average_there(tmp_path):
    from swalab.logs import epoch_line

    method = SWA(PaperSGD(lr=0.1, horizon=4), 4, lr=0.05, start_epoch=1, pre_schedule="base", score_every=1)
    trainer = val_trainer(method, tmp_path, epochs=4, eval_every=1, eval_split="val")
    trainer.fit()
    last = trainer.history[-1]
    assert {"val_acc", "val_loss", "swa_val_acc", "swa_val_nll"} <= set(last) and not any("test" in k for k in last)
    expected = metrics_from_log_probs(trainer.val_log_probs(method.averaged_for_eval(trainer.ctx)), trainer.val_labels)
    assert last["swa_val_acc"] == expected["acc"]
    line = epoch_line(last, 4, None)
    assert f"val acc {last['val_acc']:.2f}% nll {last['val_loss']:.4f}" in line and "swa val acc" in line
