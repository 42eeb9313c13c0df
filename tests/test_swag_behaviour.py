"""SWAG's draws, samples, predictors, reports and resumes against the formula of its module doc,

    w = mean + sqrt(scale) * (sqrt(var) * z1 + D^T z2 / sqrt(K - 1)),   z1 ~ N(0, I_d), z2 ~ N(0, I_K),

(SWAG-diagonal without the D term, at its own ``diag_scale``),

with the moments worked out by hand from the captured weights and the noise drawn from a generator of the test's
own, on a two-weight model driven through the method's hooks directly (no Trainer). ``meta`` stands in for a
training device other than the CPU (tensors with a device and no data), as in ``test_swa_behaviour.py``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from swalab.config import ConfigError
from swalab.methods import SWAG, TrainContext
from swalab.methods.swag import flat_parameters
from swalab.schedules import PaperSGD

from method_stand_ins import weight_row

CPU = torch.device("cpu")
META = torch.device("meta")

# three captures of a two-weight model, from epoch 0 on (capture after every epoch)
CAPTURED = [[1.0, 2.0], [3.0, 0.0], [5.0, 4.0]]
MEAN = torch.tensor([3.0, 2.0])
VAR = torch.tensor([35 / 3 - 9, 20 / 3 - 4])          # E[w^2] - E[w]^2 = (8/3, 8/3)
# deviations from the running mean after each capture: (1,2)-(1,2), (3,0)-(2,1), (5,4)-(3,2)
DEVIATIONS = torch.tensor([[0.0, 0.0], [1.0, -1.0], [2.0, 2.0]])


def swag(epochs: int = 6, **kw) -> SWAG:
    kw.setdefault("start_epoch", 0)
    return SWAG(PaperSGD(lr=0.1, horizon=epochs), epochs, lr=0.05, **kw)




def context(tmp_path, device=CPU, val=None) -> TrainContext:
    return TrainContext(model=nn.Linear(2, 1, bias=False), device=device, epochs=1, steps_per_epoch=1,
                        run_dir=tmp_path, update_bn=lambda m: None, test_log_probs=weight_row,
                        test_labels=torch.zeros(1, dtype=torch.long), val_log_probs=val)


def capture(method, ctx, weights) -> None:
    for w in weights:
        with torch.no_grad():
            ctx.model.weight.copy_(torch.tensor([w]))
        method.capture(ctx)


def captured(tmp_path, val=None, **kw):
    method = swag(**kw)
    ctx = context(tmp_path, val=val)
    method.on_train_start(ctx)
    capture(method, ctx, CAPTURED)
    return method, ctx


def draw(generator, scale, low_rank, var=VAR, deviations=DEVIATIONS, mean=MEAN):
    """One draw by the module doc's formula (z1 first, then z2, from ``generator``)."""
    z1 = torch.randn(mean.shape, generator=generator)
    spread = var.sqrt() * z1
    k = len(deviations)
    if low_rank and k > 1:
        z2 = torch.randn(k, generator=generator)
        spread = spread + deviations.T @ z2 / math.sqrt(k - 1)
    return mean + math.sqrt(scale) * spread


# ----------------------------------------------------------------------------- settings


def test_swag_keeps_its_moments_on_the_training_device_when_asked():
    swag(moments_device="train").validate(initialized=False)


def test_swag_refuses_an_unknown_moments_device_naming_its_key():
    with pytest.raises(ConfigError, match=re.escape("method.moments_device='gpu' must be 'cpu' or 'train'")):
        swag(moments_device="gpu").validate(initialized=False)


@pytest.mark.parametrize("moments_device, expected", [("cpu", CPU), ("train", META)])
def test_the_moments_live_on_method_moments_device(tmp_path, moments_device, expected):
    method = swag(moments_device=moments_device, avg_device="cpu")
    ctx = context(tmp_path, device=META)  # the model on the cpu, the training device elsewhere
    method.on_train_start(ctx)
    capture(method, ctx, CAPTURED[:2])
    assert method.sq_mean.device == expected and all(d.device == expected for d in method.deviations)


def test_flat_parameters_are_one_float32_vector_on_the_device_asked():
    model = nn.Linear(2, 1).double()
    assert flat_parameters(model, "cpu").dtype == torch.float32
    assert flat_parameters(nn.Linear(2, 1), META).device == META


# ----------------------------------------------------------------------------- draws


@pytest.mark.parametrize("k, low_rank", [(3, True), (2, True), (1, True), (3, False)],
                         ids=["K=3", "K=2", "K=1: no low-rank term", "diagonal"])
def test_a_draw_is_the_module_doc_formula_with_the_generators_noise(k, low_rank):
    method = swag(scale=0.5, rank=3)
    method.sq_mean = MEAN ** 2 + VAR
    method.deviations.extend(DEVIATIONS[-k:])
    got = method.sample(MEAN, torch.Generator().manual_seed(7), low_rank=low_rank)
    expected = draw(torch.Generator().manual_seed(7), 0.5 if low_rank else 1.0, low_rank, deviations=DEVIATIONS[-k:])
    torch.testing.assert_close(got, expected)


def test_a_draw_lands_on_the_device_of_the_mean_with_the_noise_moved_there():
    """The noise comes from a cpu generator (and after a resume the deviations from a cpu checkpoint); the draw is made
    where the mean is, the moments device."""
    method = swag(rank=3)
    method.sq_mean = (MEAN ** 2 + VAR).to(META)
    method.deviations.extend(DEVIATIONS)  # on the cpu
    assert method.sample(MEAN.to(META), torch.Generator().manual_seed(0), low_rank=True).device == META


@pytest.mark.parametrize("low_rank", [True, False], ids=["swag", "swag_diag"])
@pytest.mark.parametrize("with_val", [False, True], ids=["test split only", "with a validation split"])
def test_the_samples_are_successive_draws_scored_on_each_split(tmp_path, low_rank, with_val):
    method, ctx = captured(tmp_path, samples=2, val=(lambda m: 10 * weight_row(m)) if with_val else None)
    members = method.sampled_log_probs(ctx, low_rank, torch.Generator().manual_seed(11))
    generator = torch.Generator().manual_seed(11)
    expected = [draw(generator, 0.5 if low_rank else 1.0, low_rank) for _ in range(2)]
    assert len(members) == 2
    for got, want in zip(members.member_log_probs, expected):
        torch.testing.assert_close(got, want.reshape(1, -1))
    if with_val:
        assert len(members.member_val_log_probs) == 2
        for got, want in zip(members.member_val_log_probs, expected):
            torch.testing.assert_close(got, 10 * want.reshape(1, -1))
    else:
        assert members.val_log_proba() is None


def test_swag_and_swag_diag_draw_from_one_generator_seeded_by_one_draw_of_torchs_rng(tmp_path):
    """A run and its resume sample alike: torch's RNG (restored on a resume) gives one seed in [0, 2^62), and the
    ``swag`` samples and then the ``swag_diag`` samples are drawn from a generator seeded with it."""
    method, ctx = captured(tmp_path, samples=2)
    torch.manual_seed(1234)
    out = method.predictors(ctx)
    torch.manual_seed(1234)
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 62, (1,))))
    low_rank = [draw(generator, 0.5, True) for _ in range(2)]
    diagonal = [draw(generator, 1.0, False) for _ in range(2)]  # method.diag_scale's default
    assert set(out) == {"swa", "sgd", "swag", "swag_diag"}
    for name, expected in (("swag", low_rank), ("swag_diag", diagonal)):
        assert len(out[name].member_log_probs) == 2
        for got, want in zip(out[name].member_log_probs, expected):
            torch.testing.assert_close(got, want.reshape(1, -1))


def test_the_predictors_refuse_swag_before_any_capture_naming_the_start_setting(tmp_path):
    method = swag()
    ctx = context(tmp_path)
    method.on_train_start(ctx)
    with pytest.raises(RuntimeError, match=re.escape("SWAG has captured no model yet: check method.start and")):
        method.predictors(ctx)


# ----------------------------------------------------------------------------- reports


def test_swag_reports_its_captures_samples_scale_and_rank_and_swag_diag_its_own_scale(tmp_path):
    method, ctx = captured(tmp_path, samples=4, scale=0.25, diag_scale=0.75, rank=2)
    common = {"n_averaged": 3, "samples": 4}
    assert method.extra_metrics(ctx, ctx.test_labels) == {"swa": {"n_averaged": 3},
                                                          "swag": {**common, "scale": 0.25, "rank": 2},
                                                          "swag_diag": {**common, "scale": 0.75}}


def test_swag_refuses_a_negative_diag_scale_naming_its_key():
    with pytest.raises(ConfigError, match=re.escape("method.diag_scale")):
        swag(diag_scale=-1.0)


def test_swag_describes_its_samples_as_the_whole_run_and_budget_marks_as_theirs():
    method = swag(epochs=6, start_epoch=1, score_at_budgets=[0.5])
    whole = {"budget": 1.0, "epoch": 6}
    assert method.describe("swag") == method.describe("swag_diag") == method.describe("swa") == whole
    assert method.describe("swa@0.5") == {"budget": 0.5, "epoch": 3}


# ----------------------------------------------------------------------------- resume


def test_a_resumed_swag_keeps_the_last_rank_deviations_and_its_budget_marks(tmp_path):
    def run(ctx, method, epochs):
        for epoch in epochs:
            with torch.no_grad():
                ctx.model.weight.copy_(torch.tensor([[epoch + 1.0, 2.0 * epoch]]))
            method.on_epoch_end(ctx, epoch)

    straight, ctx = swag(epochs=6, start_epoch=1, rank=2, score_at_budgets=[0.5]), context(tmp_path / "straight")
    straight.on_train_start(ctx)
    run(ctx, straight, range(6))
    first, ctx = swag(epochs=6, start_epoch=1, rank=2, score_at_budgets=[0.5]), context(tmp_path / "paused")
    first.on_train_start(ctx)
    run(ctx, first, range(4))
    resumed, ctx = swag(epochs=6, start_epoch=1, rank=2, score_at_budgets=[0.5]), context(tmp_path / "paused")
    resumed.on_train_start(ctx)
    resumed.load_state_dict(first.state_dict(), ctx)
    run(ctx, resumed, range(4, 6))
    assert len(resumed.deviations) == 2
    for got, want in zip(resumed.deviations, straight.deviations):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(resumed.sq_mean, straight.sq_mean)
    # the mark at epoch 3 holds the average of epochs 0..2: weights (1, 0), (2, 2), (3, 4) -> (2, 2)
    assert resumed.predictors(ctx)["swa@0.5"].predict_log_proba().tolist() == [[2.0, 2.0]]


def test_a_swag_with_moments_on_the_training_device_resumes_from_a_checkpoint_read_onto_the_cpu(tmp_path):
    saved, _ = captured(tmp_path / "saved", moments_device="cpu", avg_device="cpu")
    state = saved.state_dict()  # as read_checkpoint returns it: every tensor on the cpu
    method = swag(moments_device="train", avg_device="cpu")
    ctx = context(tmp_path, device=META)
    method.on_train_start(ctx)
    method.load_state_dict(state, ctx)
    capture(method, ctx, [[7.0, 1.0]])
    assert method.sq_mean.device == META and all(d.device == META for d in method.deviations)


def test_a_swag_checkpointed_before_its_first_capture_resumes_and_its_first_capture_starts_the_moments(tmp_path):
    """A checkpoint from the SGD phase holds no moments yet (sq_mean None, no deviations); the resumed run's first
    capture starts them as a straight run's does."""
    before = swag(start_epoch=3)
    ctx = context(tmp_path)
    before.on_train_start(ctx)
    resumed = swag(start_epoch=3)
    resumed.on_train_start(ctx)
    resumed.load_state_dict(before.state_dict(), ctx)
    assert resumed.sq_mean is None and len(resumed.deviations) == 0
    capture(resumed, ctx, [[1.0, 2.0]])
    assert resumed.sq_mean.tolist() == [1.0, 4.0] and [d.tolist() for d in resumed.deviations] == [[0.0, 0.0]]
