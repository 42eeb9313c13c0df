"""Every learning-rate formula against the paper's and its reference code's, at many points.

The expected values are written out independently of ``swalab.schedules`` (straight from the
formulas in the reference), including the cycle boundaries where off-by-one errors hide.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from swalab.methods import FGE, SWA
from swalab.schedules import (
    Constant,
    Cosine,
    PaperSGD,
    Piecewise,
    cosine_lr,
    cyclic_swa_lr,
    fge_cyclic_lr,
    paper_sgd_factor,
    piecewise_lr,
    shake_shake_swa_lr,
    swalr_lr,
    warmup_factor,
)


def reference_schedule(epoch, lr_init, swa_lr, swa_start, epochs, swa=True):
    """timgaripov/swa train.py ``schedule(epoch)``, transcribed."""
    t = epoch / (swa_start if swa else epochs)
    r = swa_lr / lr_init if swa else 0.01
    if t <= 0.5:
        factor = 1.0
    elif t <= 0.9:
        factor = 1.0 - (1.0 - r) * (t - 0.5) / 0.4
    else:
        factor = r
    return lr_init * factor


# ----------------------------------------------------------------------------- paper SGD / reference


@pytest.mark.parametrize("t, expected", [(0.0, 1.0), (0.25, 1.0), (0.5, 1.0), (0.6, 1 - 0.99 * 0.25),
                                         (0.7, 1 - 0.99 * 0.5), (0.9, 0.01), (0.95, 0.01), (1.0, 0.01)])
def test_paper_sgd_factor_is_flat_then_linear_then_flat(t, expected):
    assert paper_sgd_factor(t, 0.01) == pytest.approx(expected, abs=1e-12)


def test_paper_sgd_factor_is_continuous_at_both_knees():
    for knee in (0.5, 0.9):
        assert paper_sgd_factor(knee - 1e-9, 0.2) == pytest.approx(paper_sgd_factor(knee + 1e-9, 0.2), abs=1e-7)


def test_paper_sgd_object_is_per_epoch_and_defaults_final_to_one_percent():
    s = PaperSGD(lr=0.1, horizon=150)
    for epoch in range(150):
        assert s.at(epoch, 37, 100) == pytest.approx(reference_schedule(epoch, 0.1, None, None, 150, swa=False))
    assert s(149) == pytest.approx(0.001)
    s2 = PaperSGD(lr=0.1, horizon=150, final_lr=0.05)
    assert s2(149) == pytest.approx(0.05)
    assert s2.at(10, 0, 100) == s2.at(10, 99, 100)  # set once per epoch


def test_paper_sgd_per_iteration_moves_within_an_epoch():
    s = PaperSGD(lr=0.1, horizon=10, per_iteration=True)
    assert s.at(6, 50, 100) == pytest.approx(0.1 * paper_sgd_factor(6.5 / 10, 0.01))


@pytest.mark.parametrize("kwargs, key", [(dict(lr=0.0), "schedule.lr"), (dict(lr=0.1, horizon=0), "schedule.horizon")])
def test_paper_sgd_rejects_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        PaperSGD(**kwargs)


# ----------------------------------------------------------------------------- cyclic SWA (sawtooth)


def paper_cyclic(i, a1, a2, c):
    t = ((i - 1) % c + 1) / c
    return (1 - t) * a1 + t * a2


@pytest.mark.parametrize("c", [1, 2, 5, 391])
def test_cyclic_swa_lr_matches_paper_formula_over_several_cycles(c):
    for i in range(1, 4 * c + 2):
        assert cyclic_swa_lr(i, 0.05, 0.001, c) == pytest.approx(paper_cyclic(i, 0.05, 0.001, c))


def test_cyclic_swa_lr_jumps_from_a2_back_near_a1_at_the_cycle_boundary():
    a1, a2, c = 0.05, 0.001, 10
    assert cyclic_swa_lr(c, a1, a2, c) == pytest.approx(a2)            # minimum at i = c (capture point)
    assert cyclic_swa_lr(2 * c, a1, a2, c) == pytest.approx(a2)
    after = cyclic_swa_lr(c + 1, a1, a2, c)
    assert after == pytest.approx(a1 - (a1 - a2) / c)                 # back near a1: t = 1/c
    assert after - cyclic_swa_lr(c, a1, a2, c) == pytest.approx((a1 - a2) * (c - 1) / c)  # the discontinuity
    assert cyclic_swa_lr(1, a1, a2, c) == pytest.approx(after)
    values = [cyclic_swa_lr(i, a1, a2, c) for i in range(1, c + 1)]
    assert all(x > y for x, y in zip(values, values[1:]))             # strictly decreasing within a cycle


def test_cyclic_swa_lr_with_cycle_one_is_constant_a2():
    assert [cyclic_swa_lr(i, 0.05, 0.001, 1) for i in range(1, 20)] == pytest.approx([0.001] * 19)


def test_cyclic_swa_lr_counts_iterations_from_one():
    with pytest.raises(ValueError, match="from 1"):
        cyclic_swa_lr(0, 0.05, 0.001, 3)


# ----------------------------------------------------------------------------- FGE triangular


def dmc_cyclic(epoch, it, a1, a2, c):
    t = ((epoch % c) + it) / c
    if t < 0.5:
        return a1 * (1 - 2 * t) + a2 * 2 * t
    return a1 * (2 * t - 1) + a2 * (2 - 2 * t)


@pytest.mark.parametrize("c", [2, 4, 6])
def test_fge_cyclic_lr_matches_reference_formula(c):
    steps = 8
    for epoch in range(3 * c):
        for step in range(steps):
            it = step / steps
            assert fge_cyclic_lr(epoch, it, 0.05, 1e-4, c) == pytest.approx(dmc_cyclic(epoch, it, 0.05, 1e-4, c))


@pytest.mark.parametrize("c", [2, 4])
def test_fge_cyclic_lr_is_a1_at_cycle_start_and_a2_at_mid(c):
    a1, a2 = 0.05, 0.01
    for k in range(3):
        assert fge_cyclic_lr(k * c, 0.0, a1, a2, c) == pytest.approx(a1)
        assert fge_cyclic_lr(k * c + c // 2, 0.0, a1, a2, c) == pytest.approx(a2)
    # triangular: symmetric around mid-cycle, continuous across the cycle boundary
    assert fge_cyclic_lr(0, 0.25, a1, a2, c) == pytest.approx(fge_cyclic_lr(c - 1, 0.75, a1, a2, c))
    assert fge_cyclic_lr(c - 1, 0.999, a1, a2, c) == pytest.approx(a1, rel=1e-2)


# ----------------------------------------------------------------------------- cosine, piecewise, shake-shake


def test_cosine_lr_endpoints_and_midpoint():
    assert cosine_lr(0.0, 0.2) == pytest.approx(0.2)
    assert cosine_lr(0.5, 0.2) == pytest.approx(0.1)
    assert cosine_lr(1.0, 0.2, 0.01) == pytest.approx(0.01)
    assert cosine_lr(1.5, 0.2) == pytest.approx(0.0)  # clamped past the horizon


def test_cosine_object_is_per_iteration_on_its_horizon():
    s = Cosine(lr=0.2, horizon=1800, per_iteration=True)
    assert s.at(900, 0, 391) == pytest.approx(0.1)
    assert s.at(1600, 195, 391) == pytest.approx(0.1 * (1 + math.cos(math.pi * (1600 + 195 / 391) / 1800)))


def test_piecewise_steps_down_at_fractions_of_the_horizon():
    s = Piecewise(lr=0.1, horizon=300, milestones=(0.5, 0.75), gamma=0.1)
    assert [s(e) for e in (0, 149, 150, 224, 225, 299)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    assert piecewise_lr(10, 1.0, [5, 10], 0.5) == pytest.approx(0.25)


def test_constant_schedule():
    s = Constant(lr=0.05)
    assert {s.at(e, k, 10) for e in range(5) for k in range(10)} == {0.05}


@pytest.mark.parametrize("epoch", [0, 1, 50, 99, 100, 101, 199, 250])
def test_shake_shake_swa_lr_matches_paper_formula(epoch):
    assert shake_shake_swa_lr(epoch) == pytest.approx(0.1 * (1 + math.cos(math.pi * (1600 + epoch % 100) / 1800)))


def test_shake_shake_cycle_replays_epochs_1600_to_1700_of_the_cosine_run():
    sgd = Cosine(lr=0.2, horizon=1800)
    for k in range(100):
        assert shake_shake_swa_lr(k) == pytest.approx(sgd(1600 + k))
    assert shake_shake_swa_lr(100) == pytest.approx(shake_shake_swa_lr(0))  # jumps back up
    assert shake_shake_swa_lr(99) < shake_shake_swa_lr(100)


# ----------------------------------------------------------------------------- SWALR


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_swalr_lr_matches_the_reference_formula(strategy):
    for step in range(0, 8):
        t = min(1.0, step / 5)
        a = t if strategy == "linear" else (1 - math.cos(math.pi * t)) / 2
        assert swalr_lr(step, 0.05, 0.2, 5, strategy) == pytest.approx(0.05 * a + 0.2 * (1 - a))
    assert swalr_lr(0, 0.05, 0.2, 5, strategy) == pytest.approx(0.2)
    assert swalr_lr(5, 0.05, 0.2, 5, strategy) == pytest.approx(0.05)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_swalr_lr_reproduces_torch_swalr_step_by_step(strategy):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.2)
    sched = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=5, anneal_strategy=strategy)
    for step in range(9):
        assert opt.param_groups[0]["lr"] == pytest.approx(swalr_lr(step, 0.05, 0.2, 5, strategy))
        opt.step()
        sched.step()


def test_swalr_rejects_unknown_strategy():
    with pytest.raises(ValueError, match="anneal strategy"):
        swalr_lr(1, 0.05, 0.1, 5, "step")


# ----------------------------------------------------------------------------- the methods' lr_at


def swa(**kw):
    base = PaperSGD(lr=0.1, horizon=kw.pop("horizon", 20))
    return SWA(schedule=base, epochs=20, **{"start_epoch": 12, "lr": 0.02, **kw})


def test_swa_reference_pre_schedule_is_the_reference_schedule_then_constant():
    method = swa(pre_schedule="reference")
    for epoch in range(20):
        for step in (0, 5, 9):
            assert method.lr_at(epoch, step, 10) == pytest.approx(reference_schedule(epoch, 0.1, 0.02, 12, 20))
    assert method.lr_at(12, 0, 10) == pytest.approx(0.02)


def test_swa_base_pre_schedule_keeps_the_sgd_schedule_until_swa_start():
    method = swa(pre_schedule="base")
    for epoch in range(12):
        assert method.lr_at(epoch, 3, 10) == pytest.approx(reference_schedule(epoch, 0.1, None, None, 20, swa=False))
    for epoch in range(12, 20):
        assert method.lr_at(epoch, 3, 10) == pytest.approx(0.02)


def test_swa_cyclic_phase_is_the_per_iteration_sawtooth_from_swa_start():
    method = swa(phase="cyclic", lr_min=0.001, cycle_epochs=2)
    spe = 5
    for epoch in range(12, 20):
        for step in range(spe):
            i = (epoch - 12) * spe + step + 1
            assert method.lr_at(epoch, step, spe) == pytest.approx(paper_cyclic(i, 0.02, 0.001, 2 * spe))
    assert method.lr_at(13, spe - 1, spe) == pytest.approx(0.001)      # end of the first cycle
    assert method.lr_at(14, 0, spe) == pytest.approx(0.02 - 0.019 / 10)  # jump back up


def test_swa_swalr_phase_anneals_from_the_lr_in_force():
    method = swa(phase="swalr", anneal_epochs=4, anneal_strategy="linear")
    lr_prev = reference_schedule(11, 0.1, 0.02, 12, 20)
    for k in range(6):
        assert method.lr_at(12 + k, 0, 10) == pytest.approx(swalr_lr(k, 0.02, lr_prev, 4, "linear"))


def test_swa_shake_shake_phase_counts_epochs_from_swa_start():
    method = SWA(schedule=Cosine(lr=0.2, horizon=1800, per_iteration=True), epochs=2000, start_epoch=1800,
                 lr=0.2, phase="shake_shake", pre_schedule="base")
    assert method.lr_at(1799, 0, 10) == pytest.approx(Cosine(lr=0.2, horizon=1800)(1799))
    assert method.lr_at(1800, 7, 10) == pytest.approx(shake_shake_swa_lr(0))
    assert method.lr_at(1937, 0, 10) == pytest.approx(shake_shake_swa_lr(37))


def test_fge_lr_at_pretrains_then_cycles():
    base = PaperSGD(lr=0.1, horizon=10)
    method = FGE(schedule=base, epochs=10, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=8, pre_schedule="base")
    assert method.lr_at(7, 0, 4) == pytest.approx(base(7))
    assert method.lr_at(8, 0, 4) == pytest.approx(0.05)
    assert method.lr_at(9, 0, 4) == pytest.approx(0.01)
    assert method.lr_at(8, 2, 4) == pytest.approx(dmc_cyclic(0, 0.5, 0.05, 0.01, 2))
    ref = FGE(schedule=base, epochs=10, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=8, pre_schedule="reference")
    assert ref.lr_at(7, 0, 4) == pytest.approx(reference_schedule(7, 0.1, None, None, 8, swa=False))


# ----------------------------------------------------------------------------- warmup (schedule.warmup_epochs)


def test_warmup_rises_linearly_per_step_from_lr_over_w_to_the_schedule():
    # W = 1.5 epochs of 4 steps = 6 steps: factors 1/6 .. 6/6, then 1 for good
    expected = [k / 6 for k in range(1, 7)] + [1.0] * 6
    got = [warmup_factor(e, s, 4, 1.5) for e in range(3) for s in range(4)]
    assert got == pytest.approx(expected)
    assert warmup_factor(0, 0, 4, 0.0) == 1.0  # no warmup


def test_warmup_multiplies_every_method_phase_including_the_pre_schedules():
    base = PaperSGD(lr=0.1, horizon=20, warmup_epochs=2)
    plain = PaperSGD(lr=0.1, horizon=20)
    for method, bare in [
        (swa(pre_schedule="reference"), None),
        (SWA(schedule=base, epochs=20, start_epoch=1, lr=0.02), SWA(schedule=plain, epochs=20, start_epoch=1, lr=0.02)),
        (FGE(schedule=base, epochs=10, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=0),
         FGE(schedule=plain, epochs=10, lr_max=0.05, lr_min=0.01, cycle_epochs=2, pretrain_epochs=0)),
    ]:
        if bare is None:  # the reference pre-schedule of a warmed-up base schedule
            method = SWA(schedule=base, epochs=20, start_epoch=12, lr=0.02, pre_schedule="reference")
            bare = swa(pre_schedule="reference")
        for epoch in range(4):
            for step in range(5):
                k = epoch * 5 + step + 1
                assert method.step_lr(epoch, step, 5) == pytest.approx(bare.lr_at(epoch, step, 5) * min(1, k / 10))
                assert method.lr_at(epoch, step, 5) == pytest.approx(bare.lr_at(epoch, step, 5))  # the hook is unchanged


def test_no_warmup_leaves_every_lr_exactly_as_it_was():
    method = swa(phase="cyclic", lr_min=0.001, cycle_epochs=2)
    assert all(method.step_lr(e, s, 7) == method.lr_at(e, s, 7) for e in range(20) for s in range(7))


@pytest.mark.parametrize("warmup, message", [(float("nan"), "schedule.warmup_epochs=nan must be a finite number"),
                                             (-1, "schedule.warmup_epochs=-1 must be >= 0")])
def test_a_warmup_that_is_not_a_length_is_refused_by_name(warmup, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Constant(lr=0.1, warmup_epochs=warmup)


def test_a_warmup_longer_than_the_run_is_refused_naming_the_key():
    method = SWA(schedule=Constant(lr=0.1, warmup_epochs=30), epochs=20, start_epoch=12, lr=0.02, pre_schedule="base")
    with pytest.raises(ValueError, match="schedule.warmup_epochs=30 is longer than the run's 20 epochs"):
        method.validate(initialized=False)


# ----------------------------------------------------------------------------- written out by hand (docs/mutation.md)


def test_cosine_lr_starts_at_lr_and_is_halfway_between_lr_and_lr_min_at_mid_run():
    assert cosine_lr(0.0, 0.2, 0.02) == pytest.approx(0.2)
    assert cosine_lr(0.5, 0.2, 0.02) == pytest.approx(0.11)  # 0.02 + (0.2 - 0.02) / 2


def test_a_cosine_schedules_lr_at_the_last_epoch_is_lr_min():
    s = Cosine(lr=0.2, horizon=10, lr_min=0.02)
    assert s(10) == pytest.approx(0.02)
    assert s(5) == pytest.approx(0.11)


def test_a_horizon_of_one_epoch_or_less_is_accepted():
    assert Cosine(lr=0.2)(0.5) == pytest.approx(0.1)  # the default horizon, 1 epoch
    assert Cosine(lr=0.2, horizon=0.5)(0.25) == pytest.approx(0.1)
    assert Piecewise(lr=0.1, horizon=0.5, milestones=(0.5,), gamma=0.1)(0.25) == pytest.approx(0.01)


@pytest.mark.parametrize("make, message", [
    (lambda: Constant(lr=0.0), "schedule.lr=0.0 must be > 0"),
    (lambda: Constant(lr=0.1, per_iteration="yes"), "schedule.per_iteration='yes' must be true or false"),
    (lambda: PaperSGD(lr=0.1, horizon=0), "schedule.horizon=0 must be > 0"),
    (lambda: PaperSGD(lr=0.1, final_lr=0), "schedule.final_lr=0 must be > 0"),
    (lambda: Cosine(lr=0.1, horizon=0), "schedule.horizon=0 must be > 0"),
    (lambda: Cosine(lr=0.1, lr_min=-0.01), "schedule.lr_min=-0.01 must be >= 0"),
    (lambda: Piecewise(lr=0.1, horizon=0), "schedule.horizon=0 must be > 0"),
    (lambda: Piecewise(lr=0.1, gamma=0), "schedule.gamma=0 must be > 0"),
])
def test_a_schedule_refuses_a_bad_value_saying_key_value_and_range(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_swalr_with_no_anneal_epochs_is_at_swa_lr_from_its_first_epoch():
    for strategy in ("cos", "linear"):
        assert swalr_lr(0, 0.05, 0.2, 0, strategy) == 0.05
        assert swalr_lr(3, 0.05, 0.2, 0, strategy) == 0.05


def test_swalr_over_one_anneal_epoch_starts_at_the_lr_in_force():
    assert swalr_lr(0, 0.05, 0.2, 1, "linear") == 0.2
    assert swalr_lr(1, 0.05, 0.2, 1, "linear") == 0.05
