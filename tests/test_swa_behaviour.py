"""SWA's settings, learning rates, capture epochs, budget-mark scoring and resumes, each checked against values worked
out by hand (the formulas of ``swalab.schedules`` and the capture rules of the module doc), on a one-weight model
driven through the method's hooks directly (no Trainer: each test takes milliseconds).

Where a test needs "a training device other than the CPU" it uses torch's ``meta`` device as the stand-in: tensors
there have a device and a shape but no data, which is all these routing checks look at.
"""

from __future__ import annotations

import math
import re
import signal

import pytest
import torch
from torch import nn

from swalab import faults
from swalab.checkpoint import CheckpointError, PredictionFiles
from swalab.config import ConfigError
from swalab.methods import SWA, TrainContext
from swalab.schedules import Constant, PaperSGD, Piecewise, Schedule
from swalab.upgrade import todays_method_state

from method_stand_ins import fill_weights, weight_row

CPU = torch.device("cpu")
META = torch.device("meta")  # stand-in for a training device other than the CPU


def swa(epochs: int = 10, schedule=None, **kw) -> SWA:
    """An SWA of ``epochs`` epochs (B = epochs), swa lr 0.02 from epoch 4 unless told otherwise."""
    kw.setdefault("lr", 0.02)
    if "start" not in kw:
        kw.setdefault("start_epoch", 4)
    return SWA(schedule or PaperSGD(lr=0.1, horizon=epochs), epochs, **kw)




def one_weight() -> nn.Module:
    return nn.Linear(1, 1, bias=False)




def context(model, tmp_path, steps: int = 1, device=CPU, val=None, test=weight_row, **kw) -> TrainContext:
    return TrainContext(model=model, device=device, epochs=1, steps_per_epoch=steps, run_dir=tmp_path,
                        update_bn=lambda m: None, test_log_probs=test, test_labels=torch.zeros(1, dtype=torch.long),
                        val_log_probs=val, **kw)


def drive(method, ctx, epochs: int, steps: int = 1, weight=lambda epoch, step: float(epoch + 1)):
    """Run the hooks as the trainer does; return where the average grew: ``(epoch, step)`` or ``(epoch, "end")``."""
    grew = []
    for epoch in range(epochs):
        for step in range(steps):
            fill_weights(ctx.model, weight(epoch, step))
            before = method.n_averaged
            method.on_step_end(ctx, epoch, step)
            if method.n_averaged > before:
                grew.append((epoch, step))
        before = method.n_averaged
        method.on_epoch_end(ctx, epoch)
        if method.n_averaged > before:
            grew.append((epoch, "end"))
    return grew


# ----------------------------------------------------------------------------- validate


@pytest.mark.parametrize("settings", [
    dict(phase="swalr", anneal_strategy="linear"),
    dict(phase="swalr", anneal_epochs=5),                    # the lr reaches method.lr in the last of 6 epochs
    dict(start_epoch=9),                                     # the last epoch of a 10-epoch run: captures after 9 and 10
    dict(start_epoch=0, capture_every=5),                    # captures after epochs 5 and 10 = the run's end
    dict(phase="swalr", start_epoch=0, capture_every=5, anneal_epochs=0),
    dict(start_epoch=2, capture_every=8),                    # a later start captures at the start itself, then at 10
    dict(phase="cyclic", start_epoch=0, capture_every=50, lr_min=0.01),  # cyclic captures per cycle, not per epoch
    dict(phase="cyclic", lr_min=0.02, cycle_epochs=3),       # lr_min = lr; two cycles filling the 6 epochs left
    dict(epochs=204, phase="shake_shake"),                   # exactly two 100-epoch cycles after epoch 4
    dict(score_every=10),                                    # the average scored once, after epoch 10
    dict(score_at_budgets=[0.5, 1.0]),                       # epochs 5 and 10 of (4, 10]: 2 and 7 models
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_swa_accepts_each_setting_up_to_the_edge_of_its_range(settings):
    swa(**settings).validate(initialized=False)


@pytest.mark.parametrize("settings, message", [
    (dict(phase="bogus"), "method.phase='bogus' is not one of ('constant', 'cyclic', 'swalr', 'shake_shake')"),
    (dict(schedule=Constant(lr=0.1)), "method=swa with method.pre_schedule=reference follows the paper's"),
    (dict(anneal_strategy="exp"), "method.anneal_strategy='exp' must be 'cos' or 'linear'"),
    (dict(start_epoch=10), "SWA would start averaging at epoch 10 (method.start_epoch) but the run has "
                           "trainer.epochs=10: set method.start, a fraction of the budget below method.budget=1, "
                           "or method.start_epoch below 10"),
    (dict(start=1.0), "SWA would start averaging at epoch 10 (method.start=1 of B=10) but the run has "
                      "trainer.epochs=10: set method.start,"),
    (dict(start_epoch=0, capture_every=6),
     "the SWA average would hold 1 model in a run of trainer.epochs=10: method.phase=constant captures every "
     "method.capture_every=6 epochs from epoch 0 (method.start_epoch=0), and an average needs 2 at least (one "
     "model is the SGD iterate, not an average). Lower method.capture_every, or lengthen the run (trainer.epochs)"),
    (dict(start_epoch=0, capture_every=11), "the SWA average would hold 0 models in a run of trainer.epochs=10"),
    (dict(phase="swalr", start_epoch=0, capture_every=6, anneal_epochs=0),
     "the SWA average would hold 1 model in a run of trainer.epochs=10: method.phase=swalr captures every "
     "method.capture_every=6 epochs"),
    (dict(start_epoch=2, capture_every=9), "the SWA average would hold 1 model in"),
    (dict(phase="swalr", anneal_epochs=6),
     "method.anneal_epochs=6 anneals the lr from epoch 4 on, but trainer.epochs=10 ends 6 epochs later: the lr "
     "never reaches method.lr=0.02. Set method.anneal_epochs below 6, start averaging earlier, or lengthen "
     "the run"),
    (dict(phase="cyclic", lr_min=0.021), "method.lr_min must be in (0, method.lr=0.02] for a cyclic schedule, "
                                         "got 0.021"),
    (dict(phase="cyclic"), "method.lr_min must be in (0, method.lr=0.02] for a cyclic schedule, got None"),
    (dict(phase="cyclic", lr_min=0.01, cycle_epochs=3.5),
     "the SWA average would hold 1 model in a run of trainer.epochs=10: method.phase=cyclic captures at the end of "
     "each cycle of method.cycle_epochs=3.5 epochs from epoch 4 (method.start_epoch=4), and an average needs 2 at "
     "least (one model is the SGD iterate, not an average). Lower method.start_epoch, shorten "
     "method.cycle_epochs, or lengthen the run (trainer.epochs)"),
    (dict(phase="cyclic", lr_min=0.01, cycle_epochs=6.5), "the SWA average would hold 0 models in"),
    (dict(epochs=203, phase="shake_shake"),
     "the SWA average would hold 1 model in a run of trainer.epochs=203: method.phase=shake_shake captures once per "
     "100-epoch cycle from epoch 4"),
    (dict(start_epoch=0, capture_every=4, score_at_budgets=[0.5]),
     "method.score_at_budgets: budget 0.5 is epoch 5, where the average holds 1 model(s) (method.phase=constant "
     "captures every method.capture_every=4 epochs from epoch 0): no average to score"),
    (dict(score_every=11),
     "method.score_every=11 scores the average every 11 epochs, but it exists from epoch 4 to trainer.epochs=10: "
     "it would never be scored before the end. Set method.score_every to at most 10 (0: only at the end)"),
    (dict(score_at_budgets=[0.4]), "method.score_at_budgets: budget 0.4 is epoch 4, outside (start=4, "
                                   "trainer.epochs=10]"),
    (dict(score_at_budgets=[1.1]), "method.score_at_budgets: budget 1.1 is epoch 11, outside (start=4, "
                                   "trainer.epochs=10]"),
])
def test_swa_refuses_the_first_value_past_each_range_naming_its_config_key(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        swa(**settings).validate(initialized=False)


@pytest.mark.parametrize("schedule, said", [
    (PaperSGD(lr=0.1, horizon=10, final_lr=0.001), "schedule.final_lr=0.001"),
    (PaperSGD(lr=0.1, horizon=20), "schedule.horizon=20"),
    (PaperSGD(lr=0.1, horizon=10, per_iteration=True), "schedule.per_iteration=True"),
])
def test_schedule_keys_the_reference_pre_schedule_never_reads_are_said_at_launch(schedule, said):
    caveats = swa(schedule=schedule).caveats()
    assert caveats == [f"{said} is not read by method=swa with method.pre_schedule=reference (the paper's shape from "
                       "schedule.lr to method.lr over the 4 epochs before averaging): set method.pre_schedule=base "
                       "to train with the schedule group as configured"]
    assert swa(schedule=schedule, pre_schedule="base").caveats() == []
    assert swa(schedule=PaperSGD(lr=0.1, horizon=10)).caveats() == []  # the schedule group's defaults: nothing unread


def test_a_cyclic_phase_is_counted_again_in_whole_steps_once_the_steps_per_epoch_are_known():
    """1.5 epochs of one step round to a cycle of 2 steps: the 3 epochs after the start hold one cycle, not two."""
    method = swa(start_epoch=7, phase="cyclic", lr_min=0.01, cycle_epochs=1.5)
    method.validate(initialized=False)  # in whole epochs: 3 / 1.5 = 2 cycles
    method.validate_steps(2)            # cycles of 3 steps in the 6 steps left: 2 captures
    with pytest.raises(ConfigError, match=re.escape("the SWA average would hold 1 model in a run of trainer.epochs=10")):
        method.validate_steps(1)


def test_the_captures_counted_before_training_are_the_captures_the_hooks_make(tmp_path):
    for settings in (dict(start_epoch=0, capture_every=3), dict(start_epoch=2, capture_every=3),
                     dict(phase="cyclic", lr_min=0.01, cycle_epochs=1.5), dict(phase="swalr", capture_every=2)):
        method, ctx = swa(**settings), context(one_weight(), tmp_path, steps=2)
        method.on_train_start(ctx)
        grew = drive(method, ctx, 10, steps=2)
        assert method.captures_by(10, steps_per_epoch=2) == len(grew) == method.n_averaged, settings


# ----------------------------------------------------------------------------- learning rates


def paper(t: float, ratio: float) -> float:
    """The paper's SGD factor written out (appendix): 1 to t = 0.5, linear to ``ratio`` at 0.9, then ``ratio``."""
    return 1.0 if t <= 0.5 else (1 - (1 - ratio) * (t - 0.5) / 0.4 if t <= 0.9 else ratio)


class Exponential(Schedule):
    """A schedule of one's own: ``lr * gamma ** epoch`` (defined at negative epochs too, where it exceeds ``lr``)."""

    gamma = 0.5

    def __call__(self, epoch: float) -> float:
        return self.lr * self.gamma ** epoch


COS_QUARTER = (1 - math.cos(math.pi / 4)) / 2

LR_CASES = [
    # reference pre-schedule: the paper's shape over start_epoch = 4 epochs from 0.1 down to the swa lr 0.02
    ("reference", dict(), 1, 0, 1, 0.1),
    ("reference", dict(), 3, 0, 1, 0.1 * paper(3 / 4, 0.2)),         # 0.05
    ("constant", dict(), 4, 0, 1, 0.02),
    ("constant", dict(), 9, 0, 1, 0.02),
    # base pre-schedule: the schedule group untouched up to the start (PaperSGD over 10 epochs, final 0.001)
    ("base", dict(pre_schedule="base", start_epoch=7), 6, 0, 1, 0.1 * paper(0.6, 0.01)),
    ("base at the start", dict(pre_schedule="base", start_epoch=7), 7, 0, 1, 0.02),
    ("base, constant schedule", dict(pre_schedule="base", schedule=Constant(lr=0.1)), 4, 0, 1, 0.02),
    # cyclic: a(i) = (1 - t) 0.05 + t 0.01, t = (mod(i - 1, c) + 1) / c, i counted from 1 at the start
    ("cyclic", dict(phase="cyclic", lr=0.05, lr_min=0.01), 4, 0, 4, 0.75 * 0.05 + 0.25 * 0.01),
    ("cyclic", dict(phase="cyclic", lr=0.05, lr_min=0.01), 4, 3, 4, 0.01),
    ("cyclic", dict(phase="cyclic", lr=0.05, lr_min=0.01), 5, 1, 4, 0.5 * 0.05 + 0.5 * 0.01),
    ("cyclic, one-step cycles", dict(phase="cyclic", lr=0.05, lr_min=0.01), 4, 0, 1, 0.01),
    # swalr from epoch 4: anneal from the lr in force in epoch 3 (0.05) to 0.02 over 4 epochs
    ("swalr", dict(phase="swalr", anneal_epochs=4), 4, 0, 1, 0.05),
    ("swalr", dict(phase="swalr", anneal_epochs=4), 5, 0, 1, 0.02 * COS_QUARTER + 0.05 * (1 - COS_QUARTER)),
    ("swalr", dict(phase="swalr", anneal_epochs=4), 6, 0, 1, 0.035),
    ("swalr", dict(phase="swalr", anneal_epochs=4), 8, 0, 1, 0.02),
    ("swalr linear", dict(phase="swalr", anneal_epochs=4, anneal_strategy="linear"), 5, 0, 1, 0.0425),
    # swalr from epoch 0: from schedule.lr 0.1
    ("swalr from 0", dict(phase="swalr", start_epoch=0, anneal_epochs=2, anneal_strategy="linear"), 0, 0, 1, 0.1),
    ("swalr from 0", dict(phase="swalr", start_epoch=0, anneal_epochs=2, anneal_strategy="linear"), 1, 0, 1, 0.06),
    ("swalr from 0", dict(phase="swalr", start_epoch=0, anneal_epochs=2, anneal_strategy="linear"), 2, 0, 1, 0.02),
    # swalr starts from the lr in force: schedule.lr when averaging starts at epoch 0 (nothing before it), else the
    # pre-schedule's lr in the epoch before the start, even where that is not schedule.lr (a drop at epoch 0)
    ("swalr from 0, a schedule of one's own", dict(phase="swalr", start_epoch=0, pre_schedule="base",
                                                  schedule=Exponential(lr=0.1), anneal_epochs=2), 0, 0, 1, 0.1),
    ("swalr from 1 after a drop at epoch 0",
     dict(phase="swalr", start_epoch=1, pre_schedule="base", anneal_epochs=2,
          schedule=Piecewise(lr=0.1, horizon=10, milestones=[0.0], gamma=0.5)), 1, 0, 1, 0.05),
    # shake_shake from epoch 5: 0.1 (1 + cos(pi (1600 + (e - 5) mod 100) / 1800))
    ("shake_shake", dict(epochs=110, phase="shake_shake", start_epoch=5), 35, 0, 1,
     0.1 * (1 + math.cos(math.pi * 1630 / 1800))),
    ("shake_shake", dict(epochs=110, phase="shake_shake", start_epoch=5), 105, 0, 1,
     0.1 * (1 + math.cos(math.pi * 1600 / 1800))),
]


@pytest.mark.parametrize("what, settings, epoch, step, steps_per_epoch, expected", LR_CASES,
                         ids=[f"{c[0]}-e{c[2]}s{c[3]}of{c[4]}" for c in LR_CASES])
def test_swa_lr_follows_the_pre_schedule_then_its_phase(what, settings, epoch, step, steps_per_epoch, expected):
    assert swa(**settings).lr_at(epoch, step, steps_per_epoch) == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- captures


@pytest.mark.parametrize("settings, epochs, steps, expected", [
    # constant / swalr: the reference rule, done >= start and (done - start) % capture_every == 0: done = 2, 5, 8
    (dict(start_epoch=2, capture_every=3), 9, 1, [(1, "end"), (4, "end"), (7, "end")]),
    (dict(phase="swalr", start_epoch=2, capture_every=3), 9, 1, [(1, "end"), (4, "end"), (7, "end")]),
    # cyclic, half-epoch cycles of 2 steps from epoch 2: at steps 1 and 3 of epochs 2 and 3
    (dict(phase="cyclic", start_epoch=2, lr_min=0.01, cycle_epochs=0.5), 4, 4, [(2, 1), (2, 3), (3, 1), (3, 3)]),
    # shake_shake from epoch 5: at the end of each 100-epoch cycle, done = 105 and 205
    (dict(epochs=206, phase="shake_shake", start_epoch=5), 206, 1, [(104, "end"), (204, "end")]),
], ids=["constant", "swalr", "cyclic", "shake_shake"])
def test_swa_captures_at_the_epochs_and_steps_its_phase_prescribes(tmp_path, settings, epochs, steps, expected):
    method = swa(**{"epochs": epochs, **settings})
    ctx = context(one_weight(), tmp_path, steps)
    method.on_train_start(ctx)
    assert drive(method, ctx, epochs, steps) == expected


@pytest.mark.parametrize("settings, expected", [
    # constant / swalr (docs/branching.md): the first capture ends epoch start_epoch (capture_every from epoch 0), so
    # the trunk's epoch one before it is the last that a straight-through run also reaches with no model averaged
    (dict(start_epoch=5), 4),
    (dict(start_epoch=1, capture_every=3), 0),
    (dict(start_epoch=0, capture_every=3), 2),
    (dict(phase="swalr", start_epoch=0, capture_every=3), 2),
    # cyclic and Shake-Shake capture within epochs after the start, where their own lr phase has begun: the start
    (dict(phase="cyclic", start_epoch=5, lr_min=0.01), 5),
    (dict(epochs=110, phase="shake_shake", start_epoch=5), 5),
], ids=["constant", "constant, capture_every 3", "constant from 0", "swalr from 0", "cyclic", "shake_shake"])
def test_a_branch_may_start_up_to_the_last_epoch_before_swa_holds_state(tmp_path, settings, expected):
    method = swa(**settings)
    assert method.last_branch_epoch() == expected
    if method.phase in ("constant", "swalr"):  # and indeed: driving the hooks, the first capture ends the epoch after
        ctx = context(one_weight(), tmp_path)  # the `expected` completed ones (0-based index `expected`)
        method.on_train_start(ctx)
        assert drive(method, ctx, method.epochs)[0] == (expected, "end")


def test_folding_a_model_into_the_average_is_the_swa_average_fault_point(tmp_path, monkeypatch):
    """``SWALAB_FAULT=swa_average:2:USR1`` signals the process right after the second model joins the average."""
    class Fired(Exception):
        pass

    def raise_fired(signum, frame):
        raise Fired

    monkeypatch.setenv(faults.ENV, "swa_average:2:USR1")
    faults.reset()
    previous = signal.signal(signal.SIGUSR1, raise_fired)
    try:
        method = swa(start_epoch=0)
        ctx = context(one_weight(), tmp_path)
        method.on_train_start(ctx)
        method.capture(ctx)
        with pytest.raises(Fired):
            method.capture(ctx)
        assert method.n_averaged == 2
    finally:
        signal.signal(signal.SIGUSR1, previous)
        faults.reset()


# ----------------------------------------------------------------------------- budget marks


@pytest.mark.parametrize("with_val", [False, True], ids=["test split only", "with a validation split"])
def test_a_budget_mark_keeps_the_average_scored_at_its_epoch_on_each_split(tmp_path, with_val):
    # 6 epochs, B = 6, averaging from epoch 1 every epoch; the weight is e + 1 during epoch e. Budget 0.5 is epoch 3:
    # the average then holds the weights of epochs 0, 1, 2 = (1 + 2 + 3) / 3 = 2 (later epochs move it to 3.5).
    method = swa(epochs=6, start_epoch=1, score_at_budgets=[0.5])
    val = (lambda m: 10 * weight_row(m)) if with_val else None
    ctx = context(one_weight(), tmp_path, val=val)
    method.on_train_start(ctx)
    drive(method, ctx, 6)
    assert float(method.averaged.module.weight.detach()) == pytest.approx(3.5)
    assert ctx.predictions.load("swa@0.5").tolist() == [[2.0]]
    mark = method.predictors(ctx)["swa@0.5"]
    assert mark.predict_log_proba().tolist() == [[2.0]]
    if with_val:
        assert ctx.predictions.load("swa@0.5_val").tolist() == [[20.0]]
        assert mark.val_log_proba().tolist() == [[20.0]]
    else:
        assert mark.val_log_proba() is None and not (ctx.predictions.dir / "swa@0.5_val.pt").exists()
    assert method.describe("swa@0.5") == {"budget": 0.5, "epoch": 3}
    assert method.describe("swa") == {"budget": 1.0, "epoch": 6}


def test_the_predictors_refuse_an_average_of_no_model_naming_the_start_setting(tmp_path):
    method = swa()
    ctx = context(one_weight(), tmp_path)
    method.on_train_start(ctx)
    with pytest.raises(RuntimeError, match=re.escape("SWA has averaged no model yet: check method.start and")):
        method.predictors(ctx)


def test_extra_metrics_report_how_many_models_the_average_holds(tmp_path):
    method = swa(start_epoch=0)
    ctx = context(one_weight(), tmp_path)
    method.on_train_start(ctx)
    for _ in range(3):
        method.capture(ctx)
    assert method.extra_metrics(ctx, ctx.test_labels) == {"swa": {"n_averaged": 3}}


# ----------------------------------------------------------------------------- devices


@pytest.mark.parametrize("avg_device, expected", [("train", META), ("cpu", CPU)])
def test_the_average_lives_on_run_avg_device(tmp_path, avg_device, expected):
    method = swa(avg_device=avg_device)
    method.on_train_start(context(one_weight(), tmp_path, device=META))
    assert next(method.averaged.module.parameters()).device == expected


def test_an_average_kept_on_the_cpu_is_scored_on_the_training_device_and_stays_on_the_cpu(tmp_path):
    scored_on = []
    method = swa(epochs=6, start_epoch=1, score_at_budgets=[0.5], avg_device="cpu")
    ctx = context(one_weight(), tmp_path, device=META,
                  test=lambda m: scored_on.append(next(m.parameters()).device) or torch.zeros(1, 2))
    method.on_train_start(ctx)
    drive(method, ctx, 4)
    assert scored_on == [META]  # the budget mark at epoch 3, scored on the training device ...
    assert next(method.averaged.module.parameters()).device == CPU  # ... from a copy: the average stays on the cpu
    # at the end of training the average itself moves to the training device (its BN statistics go into final.pt)
    assert method.predictors(ctx)["swa"].model is method.averaged.module
    assert all(t.device == META for t in method.final_weights()["swa"].values())


# ----------------------------------------------------------------------------- weights and checkpoints


def test_an_swa_that_never_started_training_has_no_average_to_save():
    method = swa()
    assert method.final_weights() == {}
    assert method.state_dict()["averaged"] is None


def test_the_final_weights_are_a_snapshot_later_captures_leave_alone(tmp_path):
    method = swa(start_epoch=0)
    ctx = context(one_weight(), tmp_path)
    method.on_train_start(ctx)
    fill_weights(ctx.model, 2.0)
    method.capture(ctx)
    final = method.final_weights()
    fill_weights(ctx.model, 4.0)
    method.capture(ctx)
    assert float(method.averaged.module.weight.detach()) == 3.0
    assert final["swa"]["weight"].tolist() == [[2.0]]


def scored_run(tmp_path, with_val=True):
    """The budget-mark run of above stopped after epoch 4 (the mark at epoch 3 scored): (method, ctx)."""
    method = swa(epochs=6, start_epoch=1, score_at_budgets=[0.5])
    ctx = context(one_weight(), tmp_path, val=(lambda m: 10 * weight_row(m)) if with_val else None)
    method.on_train_start(ctx)
    drive(method, ctx, 4)
    return method, ctx


def resumed(state, tmp_path, with_val=True):
    method = swa(epochs=6, start_epoch=1, score_at_budgets=[0.5])
    ctx = context(one_weight(), tmp_path, val=(lambda m: 10 * weight_row(m)) if with_val else None)
    method.on_train_start(ctx)
    method.load_state_dict(state, ctx)
    return method, ctx


def test_a_resume_restores_the_average_and_the_budget_marks_on_both_splits(tmp_path):
    method, _ = scored_run(tmp_path)
    again, ctx = resumed(method.state_dict(), tmp_path)
    assert again.n_averaged == 4 and float(again.averaged.module.weight.detach()) == pytest.approx(2.5)  # (1+2+3+4)/4
    mark = again.predictors(ctx)["swa@0.5"]
    assert mark.predict_log_proba().tolist() == [[2.0]] and mark.val_log_proba().tolist() == [[20.0]]


def test_a_checkpoint_from_before_validation_scoring_resumes_with_test_marks_only(tmp_path):
    method, _ = scored_run(tmp_path, with_val=False)
    state = method.state_dict()
    del state["budget_val_files"]  # written before swalab scored budget marks on a validation split
    again, ctx = resumed(state, tmp_path, with_val=False)
    mark = again.predictors(ctx)["swa@0.5"]
    assert mark.predict_log_proba().tolist() == [[2.0]] and mark.val_log_proba() is None


def upgraded(state: dict, run_dir) -> dict:
    """An earlier swalab's SWA state (its scored marks inside) as ``swalab.upgrade`` rewrites its checkpoint: each
    mark's predictions written to its file, the state naming them."""
    state, files, _ = todays_method_state(state)
    for name, tensor in files.items():
        PredictionFiles(run_dir).save(name, tensor)
    return state


def test_an_earlier_checkpoint_holding_probabilities_is_refused_in_one_line_naming_the_upgrade(tmp_path):
    method, _ = scored_run(tmp_path / "before")
    state = {"averaged": method.state_dict()["averaged"], "budget_probs": {"swa@0.5": torch.tensor([[0.25, 0.75]])}}
    with pytest.raises(CheckpointError, match=rf"SWA state of a checkpoint of {tmp_path} is in the format of an "
                                              rf"earlier swalab.*python -m swalab.upgrade {tmp_path} --write$"):
        resumed(state, tmp_path)


def test_an_earlier_checkpoint_holding_probabilities_is_upgraded_to_its_marks_as_log_probabilities(tmp_path):
    method, _ = scored_run(tmp_path / "before")
    state = {"averaged": method.state_dict()["averaged"], "budget_probs": {"swa@0.5": torch.tensor([[0.25, 0.75]])}}
    again, ctx = resumed(upgraded(state, tmp_path), tmp_path)
    expected = [[math.log(0.25), math.log(0.75)]]
    torch.testing.assert_close(ctx.predictions.load("swa@0.5"), torch.tensor(expected))
    mark = again.predictors(ctx)["swa@0.5"]
    torch.testing.assert_close(mark.predict_log_proba(), torch.tensor(expected))
    assert mark.val_log_proba() is None


def test_an_earlier_checkpoint_holding_log_probabilities_is_upgraded_to_its_files_on_both_splits(tmp_path):
    method, _ = scored_run(tmp_path / "before")
    test, val = torch.tensor([[-0.5, -1.0]]), torch.tensor([[-2.0, -0.1]])
    state = {"averaged": method.state_dict()["averaged"], "budget_log_probs": {"swa@0.5": test},
             "budget_val_log_probs": {"swa@0.5": val}}
    again, ctx = resumed(upgraded(state, tmp_path), tmp_path)
    assert torch.equal(ctx.predictions.load("swa@0.5"), test) and torch.equal(ctx.predictions.load("swa@0.5_val"), val)
    mark = again.predictors(ctx)["swa@0.5"]
    assert torch.equal(mark.predict_log_proba(), test) and torch.equal(mark.val_log_proba(), val)
    # and the resumed run's next checkpoint names them, so a second resume reads the files
    third, ctx3 = resumed(again.state_dict(), tmp_path)
    assert torch.equal(third.predictors(ctx3)["swa@0.5"].val_log_proba(), val)


@pytest.mark.parametrize("settings, start", [
    (dict(start=0.5, capture_every=6), "method.start=0.5 of B=10"),
    (dict(start_epoch=5, capture_every=6), "method.start_epoch=5"),
])
def test_an_average_of_one_model_reads_as_one_model_says_why_and_names_each_key_with_its_value_once(settings, start):
    with pytest.raises(ConfigError) as info:
        swa(**settings).validate(initialized=False)
    said = str(info.value)
    assert said.startswith("the SWA average would hold 1 model in a run of trainer.epochs=10: ")
    assert f"from epoch 5 ({start})" in said and "needs 2 at least (one model is the SGD iterate, not an average)" in said
    key = start.split("=")[0]
    assert said.count(key) == 2 and f"start averaging earlier ({key})" not in said.lower()
    assert said.endswith(f"Lower {key}, lower method.capture_every, or lengthen the run (trainer.epochs)")
