"""SWAG: SWA's training with a Gaussian over its iterates; samples averaged, each with its own BN statistics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from swalab.config import ConfigError
from swalab.methods import SWA, SWAG
from swalab.methods.swag import flat_parameters
from swalab.schedules import PaperSGD

from test_methods import make_trainer, toy_net


def swag(scale=0.5, samples=3, **kw):
    return SWAG(PaperSGD(lr=0.1, horizon=6), 6, lr=0.05, start_epoch=2, pre_schedule="base", scale=scale,
                samples=samples, **kw)


def test_a_swag_sample_of_zero_scale_is_the_swa_model_exactly(tmp_path):
    method = swag(scale=0.0, samples=1)
    trainer = make_trainer(method, tmp_path, epochs=6)
    trainer.fit()
    ctx = trainer.ctx
    swa_log_probs = ctx.test_log_probs(method.averaged_for_eval(ctx))
    generator = torch.Generator().manual_seed(0)
    sample = method.sample(flat_parameters(method.averaged.module, "cpu"), generator, low_rank=True)
    assert torch.equal(sample, flat_parameters(method.averaged.module, "cpu"))
    torch.testing.assert_close(method.sampled_log_probs(ctx, True, generator).log_probs(), swa_log_probs,
                               rtol=0, atol=1e-6)


def test_the_moments_are_the_mean_square_and_the_last_deviations_of_the_captured_weights():
    method = SWAG(PaperSGD(lr=0.1, horizon=4), 4, lr=0.05, start_epoch=0, rank=2, samples=1)
    model = nn.Linear(2, 1, bias=False)
    ctx = SimpleNamespace(model=model, device=torch.device("cpu"))
    method.averaged = torch.optim.swa_utils.AveragedModel(model)
    captured = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 0.0]]), torch.tensor([[5.0, 4.0]])]
    for w in captured:
        with torch.no_grad():
            model.weight.copy_(w)
        method.capture(ctx)
    ws = torch.cat(captured)
    torch.testing.assert_close(flat_parameters(method.averaged.module, "cpu"), ws.mean(0))     # 3, 2
    torch.testing.assert_close(method.sq_mean, (ws ** 2).mean(0))                             # 35/3, 20/3
    # deviations from the running mean after each capture: (3,0)-(2,1) and (5,4)-(3,2); only the last rank=2 kept
    assert len(method.deviations) == 2
    torch.testing.assert_close(method.deviations[0], torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(method.deviations[1], torch.tensor([2.0, 2.0]))


def diagonal_draws(method: SWAG, mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    method.sq_mean = mean ** 2 + variance
    generator = torch.Generator().manual_seed(3)
    return torch.stack([method.sample(mean, generator, low_rank=False) for _ in range(20000)])


def test_swag_diagonal_samples_its_gaussian_n_of_the_swa_mean_and_the_diagonal_variance_by_default():
    """The paper's SWAG-diagonal is N(theta_SWA, Sigma_diag) (the authors sample it at scale 1.0), whatever the
    low-rank SWAG's ``method.scale`` (0.5)."""
    method = SWAG(PaperSGD(lr=0.1, horizon=4), 4, lr=0.05, start_epoch=0, scale=0.5)
    mean, variance = torch.tensor([1.0, -2.0]), torch.tensor([4.0, 0.25])
    draws = diagonal_draws(method, mean, variance)
    torch.testing.assert_close(draws.mean(0), mean, atol=0.05, rtol=0)
    torch.testing.assert_close(draws.var(0), variance, rtol=0.05, atol=0)


def test_swag_diagonal_samples_spread_by_its_own_diag_scale_times_the_variance():
    method = SWAG(PaperSGD(lr=0.1, horizon=4), 4, lr=0.05, start_epoch=0, scale=1.0, diag_scale=0.25)
    mean, variance = torch.tensor([1.0, -2.0]), torch.tensor([4.0, 0.25])
    torch.testing.assert_close(diagonal_draws(method, mean, variance).var(0), 0.25 * variance, rtol=0.05, atol=0)


def test_swag_trains_exactly_as_swa_and_scores_swag_and_swag_diag_beside_it(tmp_path):
    swa_metrics = make_trainer(SWA(PaperSGD(lr=0.1, horizon=6), 6, lr=0.05, start_epoch=2, pre_schedule="base"),
                               tmp_path / "swa", epochs=6).fit().metrics
    metrics = make_trainer(swag(), tmp_path / "swag", epochs=6).fit().metrics
    assert metrics["swa"]["acc"] == swa_metrics["swa"]["acc"] and metrics["swa"]["nll"] == swa_metrics["swa"]["nll"]
    assert metrics["swag"]["samples"] == 3 and metrics["swag"]["rank"] == 5 and metrics["swag"]["scale"] == 0.5
    assert metrics["swag_diag"]["scale"] == 1.0  # method.diag_scale's default, the authors' SWAG-diagonal
    assert math.isfinite(metrics["swag"]["nll"]) and "brier" in metrics["swag"]


def test_swag_resumes_mid_run_to_the_same_samples(tmp_path):
    straight = make_trainer(swag(), tmp_path / "straight", epochs=6).fit().metrics
    first = make_trainer(swag(), tmp_path / "paused", epochs=6)
    first.opts.epochs = 4  # stop after epoch 4 as a killed run would
    first.fit()
    state = first.store.latest()
    resumed = make_trainer(swag(), tmp_path / "paused", epochs=6)
    assert resumed.fit(state).metrics == straight


def test_a_low_rank_draw_has_the_covariance_scale_times_diagonal_plus_deviations():
    """w = mean + sqrt(scale) (sqrt(var) z1 + D^T z2 / sqrt(K-1)): covariance scale (diag(var) + D^T D / (K-1))."""
    method = SWAG(PaperSGD(lr=0.1, horizon=4), 4, lr=0.05, start_epoch=0, scale=0.5, rank=3)
    mean = torch.tensor([0.5, -1.0, 2.0])
    var = torch.tensor([0.2, 1.0, 0.05])
    method.sq_mean = mean ** 2 + var
    deviations = torch.tensor([[1.0, 0.0, 1.0], [0.0, 2.0, -1.0], [1.0, 1.0, 0.0]])
    method.deviations.extend(deviations)
    generator = torch.Generator().manual_seed(5)
    draws = torch.stack([method.sample(mean, generator, low_rank=True) for _ in range(40000)])
    expected = 0.5 * (torch.diag(var) + deviations.T @ deviations / 2)
    torch.testing.assert_close(draws.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(torch.cov(draws.T), expected, atol=0.04, rtol=0.05)


def test_moments_device_must_be_cpu_or_the_training_device():
    with pytest.raises(ConfigError, match=r"method.moments_device='gpu' must be 'cpu' or 'train'"):
        swag(moments_device="gpu").validate(initialized=False)


@pytest.mark.parametrize("where", ["cpu", "train"])
def test_the_moments_live_where_moments_device_says_and_sample_alike(tmp_path, where):
    method = swag(moments_device=where)
    metrics = make_trainer(method, tmp_path, epochs=6).fit().metrics
    assert method.sq_mean.device.type == "cpu" and all(d.device.type == "cpu" for d in method.deviations)
    reference = make_trainer(swag(), tmp_path / "cpu", epochs=6).fit().metrics
    assert metrics == reference  # on a CPU run the training device is the CPU: the same numbers either way


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("where, device", [("cpu", "cpu"), ("train", "cuda")])
def test_on_a_gpu_the_moments_stay_on_the_cpu_unless_asked_and_sample_the_same_weights(tmp_path, where, device):
    from swalab.data import ResidentLoader
    from swalab.trainer import Trainer, TrainerOptions

    from test_methods import split

    cuda = torch.device("cuda")
    common = dict(device=cuda, mean=[0.5, 0.5], std=[0.25, 0.25])
    train_split = split(48, seed=1)
    runs = {}
    for moments in ("cpu", where):
        method = swag(moments_device=moments)
        trainer = Trainer(toy_net(), method, ResidentLoader(train_split, 8, train=True, pad=1, seed=0, **common),
                          ResidentLoader(split(20, seed=2), 7, train=False, **common),
                          ResidentLoader(train_split, 8, train=True, pad=1, drop_last=False, seed=1, **common), cuda,
                          tmp_path / moments, TrainerOptions(epochs=6, progress=False, handle_signals=False,
                                                             eval_every=0, precision="fp32", checkpoint_every=1000))
        runs[moments] = (method, trainer.fit().metrics)
    method, metrics = runs[where]
    assert method.sq_mean.device.type == device and method.deviations[0].device.type == device
    assert metrics["swag"]["acc"] == pytest.approx(runs["cpu"][1]["swag"]["acc"], abs=100 / 20)
    assert metrics["swag"]["nll"] == pytest.approx(runs["cpu"][1]["swag"]["nll"], rel=1e-3)
