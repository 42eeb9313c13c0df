"""The hook protocol's shared pieces (methods/base.py), EMA's hooks and method=pretrained, driven hook by hook.

Each test builds a ``TrainContext`` from lambdas and a tiny ``nn.Linear`` (no Trainer, no data loader) and checks
what a user relies on: the key a refusal names at its exact boundary, the lr of every warmup step, where an
average lives and what a resume restores, against values worked out by hand in the test.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from swalab import distributed
from swalab.branching import BranchError, check_branch
from swalab.checkpoint import PredictionFiles
from swalab.config import ConfigError
from swalab.methods import EMA, FGE, TrainContext
from swalab.methods.base import Method, averages_device, on_training_device
from swalab.methods.pretrained import Pretrained
from swalab.schedules import Constant, Cosine, PaperSGD

from method_stand_ins import fill_weights, scores

CPU = torch.device("cpu")
# A device that compares unequal to the one CPU tensors report (``cpu``): it stands in for a GPU run's training device
# on a machine without one, so the "not on the training device" branches run on the CPU.
CPU0 = torch.device("cpu", 0)
X_TEST, X_VAL = torch.tensor([[1.0, -2.0], [0.5, 3.0]]), torch.tensor([[-1.0, 4.0]])

pytestmark = pytest.mark.usefixtures("one_thread")




def make_ctx(model: nn.Module, tmp_path, steps: int = 1, **kw) -> TrainContext:
    kw.setdefault("device", CPU)
    kw.setdefault("update_bn", lambda m: None)
    return TrainContext(model=model, epochs=1, steps_per_epoch=steps, run_dir=tmp_path, test_log_probs=scores(X_TEST),
                        test_labels=torch.tensor([0, 1]), **kw)


def linear(w: float = 1.0) -> nn.Linear:
    net = nn.Linear(2, 3)
    with torch.no_grad():
        net.weight.fill_(w)
        net.bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    return net




class OwnSchedule:
    """A schedule of one's own (``_target_`` of a class of a user's): an ``at`` and nothing else, no warmup field."""

    def at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        return 0.1 * (epoch + 1)


# ----------------------------------------------------------------------------- TrainContext


def test_a_context_keeps_predictions_under_the_runs_checkpoints_unless_it_is_given_its_own(tmp_path):
    ctx = make_ctx(linear(), tmp_path / "run")
    ctx.predictions.save("p", torch.ones(2))
    assert torch.equal(torch.load(tmp_path / "run" / "checkpoints" / "predictions" / "p.pt"), torch.ones(2))
    given = PredictionFiles(tmp_path / "other", write=False)  # a rank that does not write
    assert make_ctx(linear(), tmp_path / "run", predictions=given).predictions is given


def test_a_context_scores_and_labels_the_split_it_is_asked_for(tmp_path):
    model = linear()
    val_labels = torch.tensor([2])
    ctx = make_ctx(model, tmp_path, val_log_probs=scores(X_VAL), val_labels=val_labels)
    with torch.no_grad():
        torch.testing.assert_close(ctx.log_probs_on("val", model), model(X_VAL).log_softmax(1))
        torch.testing.assert_close(ctx.log_probs_on("test", model), model(X_TEST).log_softmax(1))
    assert ctx.labels_on("val") is val_labels and torch.equal(ctx.labels_on("test"), torch.tensor([0, 1]))


# ----------------------------------------------------------------------------- Method: keys and refusals


@pytest.mark.parametrize("schedule, epochs, budget", [
    (Constant(lr=0.1), 1, 1.0),  # one epoch: the first that trains something
    (Constant(lr=0.1), 3, 0.01),  # any positive budget
    (Constant(lr=0.1, warmup_epochs=3), 3, 1.0),  # a warmup as long as the run
    (OwnSchedule(), 2, 1.0),  # a schedule without a warmup_epochs field has no warmup
])
def test_the_last_accepted_run_lengths_budgets_and_warmups_pass(schedule, epochs, budget):
    Method(schedule, epochs, budget, name="sgd").validate(initialized=False)


@pytest.mark.parametrize("schedule, epochs, budget, named", [
    (Constant(lr=0.1), 0, 1.0, ["trainer.epochs=0", "method=sgd",
                                "use method=pretrained to score the starting weights"]),
    (Constant(lr=0.1), 3, 0.0, ["method.budget=0 must be > 0 for method=sgd", "model.budget_epochs", "trainer.epochs",
                                "method=pretrained"]),
    (Constant(lr=0.1, warmup_epochs=3.5), 3, 1.0, ["schedule.warmup_epochs=3.5", "the run's 3 epochs",
                                                   "schedule.warmup_epochs to at most 3"]),
])
def test_the_first_refused_run_length_budget_and_warmup_name_their_keys(schedule, epochs, budget, named):
    with pytest.raises(ConfigError) as refused:
        Method(schedule, epochs, budget, name="sgd").validate(initialized=False)
    for text in named:
        assert text in str(refused.value)


# ----------------------------------------------------------------------------- Method: the lr of every step


@pytest.mark.parametrize("steps_per_epoch", [4, 3])
def test_the_warmup_ramps_the_base_schedules_lr_linearly_over_its_first_steps(steps_per_epoch):
    method = Method(Constant(lr=0.2, warmup_epochs=2), 4)
    warmup_steps = 2 * steps_per_epoch
    for epoch in range(4):
        for step in range(steps_per_epoch):
            k = epoch * steps_per_epoch + step + 1  # optimizer steps taken once this one is
            expected = 0.2 * k / warmup_steps if k < warmup_steps else 0.2
            assert method.step_lr(epoch, step, steps_per_epoch) == pytest.approx(expected, rel=1e-12), (epoch, step)


def test_the_warmup_multiplies_the_methods_own_lr_fges_cycle_included():
    """FGE from epoch 0 (model.init_from): cycles of 2 epochs lr_max=0.05 -> lr_min=0.01 -> 0.05, warmup 1.5 epochs
    of 4 steps (6 steps)."""
    method = FGE(Constant(lr=0.3, warmup_epochs=1.5), 4, lr_max=0.05, lr_min=0.01, cycle_epochs=2)
    for epoch in range(4):
        for step in range(4):
            t = ((epoch % 2) + step / 4) / 2  # position in the cycle
            cycle_lr = 0.05 + (0.01 - 0.05) * 2 * t if t < 0.5 else 0.01 + (0.05 - 0.01) * (2 * t - 1)
            k = epoch * 4 + step + 1
            expected = cycle_lr * min(1.0, k / 6)
            assert method.step_lr(epoch, step, 4) == pytest.approx(expected, rel=1e-12), (epoch, step)


def test_a_schedule_of_ones_own_without_a_warmup_field_gives_its_own_lr_from_the_first_step():
    method = Method(OwnSchedule(), 3)
    assert [method.step_lr(e, 0, 5) for e in range(3)] == pytest.approx([0.1, 0.2, 0.3], rel=1e-12)


# ----------------------------------------------------------------------------- where averages live


def test_an_average_lives_on_the_cpu_with_avg_device_cpu_else_on_the_training_device(tmp_path):
    ctx = make_ctx(linear(), tmp_path, device=torch.device("cuda", 0))  # only compared: no tensor goes there
    assert averages_device("cpu", ctx) == CPU
    assert averages_device("train", ctx) == torch.device("cuda", 0)


def test_a_module_on_the_training_device_is_scored_as_it_is(tmp_path):
    module, ctx = linear(), make_ctx(linear(), tmp_path)
    assert on_training_device(module, ctx, for_good=True) is module
    assert on_training_device(module, ctx, for_good=False) is module


def test_a_module_elsewhere_is_moved_for_good_at_the_end_but_copied_for_a_score_during_training(tmp_path):
    meta = torch.device("meta")  # a training device other than the CPU the module lives on
    ctx = make_ctx(linear(), tmp_path, device=meta)
    kept = linear(2.0)
    scored = on_training_device(kept, ctx, for_good=False)
    assert scored is not kept and next(scored.parameters()).device == meta
    assert next(kept.parameters()).device == CPU and torch.equal(kept.weight, torch.full((3, 2), 2.0))
    moved = linear(2.0)
    assert on_training_device(moved, ctx, for_good=True) is moved and next(moved.parameters()).device == meta


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_average_on_the_gpu_of_a_run_device_auto_run_is_scored_as_it_is(tmp_path):
    module = linear().cuda()
    ctx = make_ctx(linear(), tmp_path, device=distributed.local_device(torch.device("cuda")))  # run.device=auto
    assert on_training_device(module, ctx, for_good=False) is module


# ----------------------------------------------------------------------------- pre_schedule, recipes, branches


def test_fges_pre_schedule_must_be_reference_or_base_naming_the_key():
    with pytest.raises(ConfigError, match=r"method\.pre_schedule='paper' must be 'reference' or 'base'"):
        FGE(Constant(lr=0.1), 6, lr_max=0.05, lr_min=0.01, pretrain_epochs=2, pre_schedule="paper").validate(False)


def test_the_reference_pre_schedule_with_another_schedule_is_refused_naming_the_schedule_and_the_way_out():
    with pytest.raises(ConfigError) as refused:
        FGE(Cosine(lr=0.1, horizon=6), 6, lr_max=0.05, lr_min=0.01, pretrain_epochs=2,
            pre_schedule="reference").validate(False)
    for text in ("method=fge with method.pre_schedule=reference", "(Cosine)", "set method.pre_schedule=base"):
        assert text in str(refused.value)
    FGE(PaperSGD(lr=0.1, horizon=6), 6, lr_max=0.05, lr_min=0.01, pretrain_epochs=2,
        pre_schedule="reference").validate(False)  # the paper's schedule: accepted


@pytest.mark.parametrize("method", [Method(Constant(lr=0.1), 4, name="sgd"),
                                    EMA(Constant(lr=0.1), 4, warmup=False)], ids=["base", "ema"])
def test_a_method_with_state_from_its_first_step_branches_only_from_epoch_0(method):
    check_branch(method, {"epoch": 0, "history": []}, steps_per_epoch=2)
    with pytest.raises(BranchError, match="after epoch 0 .*branch at epoch 0 or earlier"):
        check_branch(method, {"epoch": 1, "history": []}, steps_per_epoch=2)


# ----------------------------------------------------------------------------- EMA: checks


@pytest.mark.parametrize("bn", ["average", "recompute"])
def test_ema_accepts_both_bn_modes(bn):
    EMA(Constant(lr=0.1), 2, warmup=False, bn=bn).validate(initialized=False)


def test_ema_refuses_another_bn_mode_naming_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"method\.bn must be 'average' or 'recompute', got 'mean'"):
        EMA(Constant(lr=0.1), 2, warmup=False, bn="mean").validate(initialized=False)


def test_ema_update_every_may_be_the_runs_step_count_but_not_one_more():
    EMA(Constant(lr=0.1), 2, warmup=False, update_every=6).validate_steps(3)  # 2 epochs of 3 steps
    with pytest.raises(ConfigError) as refused:
        EMA(Constant(lr=0.1), 2, warmup=False, update_every=7).validate_steps(3)
    for text in ("method.update_every=7", "only 6 optimizer steps", "(2 epochs of 3)",
                 "Set method.update_every to at most 6"):
        assert text in str(refused.value)


# ----------------------------------------------------------------------------- EMA: the average


def scalar(w: float) -> nn.Linear:
    model = nn.Linear(1, 1, bias=False)
    fill_weights(model, w)
    return model


def run_steps(method: EMA, ctx: TrainContext, values: dict[tuple[int, int], float]) -> None:
    for (epoch, step), w in values.items():
        fill_weights(ctx.model, w)
        method.on_step_end(ctx, epoch, step)


def test_ema_updates_every_n_optimizer_steps_counted_across_epochs(tmp_path):
    d, w0 = 0.5, 1.0
    ctx = make_ctx(scalar(w0), tmp_path, steps=4)
    method = EMA(Constant(lr=0.1), 2, decay=d, warmup=False, update_every=3)
    method.on_train_start(ctx)
    values = {(e, s): 10.0 * (e * 4 + s + 1) for e in range(2) for s in range(4)}  # 10, 20, ..., 80
    run_steps(method, ctx, values)
    expected = d * (d * w0 + (1 - d) * 30.0) + (1 - d) * 60.0  # updates after the run's steps 3 and 6
    assert float(method.ema.module.weight.detach()) == pytest.approx(expected, rel=1e-6)
    assert method.updates == 2


def test_ema_warmup_follows_warmup_gamma_and_warmup_power(tmp_path):
    gamma, power, cap, w0 = 2.0, 1.0, 0.9, 0.0
    ctx = make_ctx(scalar(w0), tmp_path, steps=5)
    method = EMA(Constant(lr=0.1), 1, decay=cap, warmup=True, warmup_gamma=gamma, warmup_power=power)
    method.on_train_start(ctx)
    values = [1.0, -3.0, 0.5, 4.0, 2.0]
    run_steps(method, ctx, {(0, s): w for s, w in enumerate(values)})
    ema = w0
    for k, w in enumerate(values, start=1):  # decay 1 - (1 + (k - 1) / gamma) ** -power: 0, 1/3, 1/2, 3/5, 2/3
        decay = min(1 - (1 + (k - 1) / gamma) ** -power, cap)
        ema = decay * ema + (1 - decay) * w
    assert float(method.ema.module.weight.detach()) == pytest.approx(ema, rel=1e-6)


def bf16_bn_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)).to(torch.bfloat16)
    fill_weights(model, 1.0)
    model[1].running_mean.fill_(1.0)
    return model


@pytest.mark.parametrize("bn", ["average", "recompute"])
def test_a_bf16_ema_accumulates_updates_below_bf16_resolution_and_treats_bn_buffers_per_bn(tmp_path, bn):
    """decay 0.999 moves a bf16 weight of 1 towards 2 by 0.001 a step, under half of bf16's spacing at 1 (2^-7): a
    plain lerp would leave it at 1. timm's stochastic rounding gets 2 - 0.999^100 = 1.0952 on average."""
    model = bf16_bn_model()
    ctx = make_ctx(model, tmp_path, steps=100)
    method = EMA(Constant(lr=0.1), 1, decay=0.999, warmup=False, bn=bn)
    method.on_train_start(ctx)
    fill_weights(model, 2.0)
    model[1].running_mean.fill_(2.0)
    run_steps(method, ctx, {(0, s): 2.0 for s in range(100)})
    ema = method.ema.module
    assert ema[0].weight.dtype == torch.bfloat16
    assert float(ema[0].weight.detach().float().mean()) == pytest.approx(2 - 0.999 ** 100, abs=0.01)
    running_mean = ema[1].running_mean.float()
    if bn == "recompute":  # buffers copied from the live model, to be recomputed before scoring
        assert torch.equal(running_mean, torch.full((64,), 2.0))
    else:  # averaged like the weights
        assert float(running_mean.mean()) == pytest.approx(2 - 0.999 ** 100, abs=0.02)


def test_a_bf16_ema_with_warmup_copies_the_live_weights_at_its_first_update(tmp_path):
    model = bf16_bn_model()
    ctx = make_ctx(model, tmp_path)
    method = EMA(Constant(lr=0.1), 1, decay=0.999, warmup=True)
    method.on_train_start(ctx)
    fill_weights(model, 2.0)
    method.on_step_end(ctx, 0, 0)
    assert torch.equal(method.ema.module[0].weight.float(), torch.full((64, 64), 2.0))


def test_an_ema_kept_on_the_cpu_averages_like_one_kept_on_the_training_device(tmp_path):
    """run.avg_device=cpu on a run whose training device is not the one the CPU's tensors report (cpu:0 standing in for
    a GPU): timm's per-tensor update, the same numbers as the one kept beside the model."""
    finals = []
    for where in ("train", "cpu"):
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        fill_weights(model, 0.0)
        ctx = make_ctx(model, tmp_path, steps=4, device=CPU0)
        method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False, avg_device=where)
        method.on_train_start(ctx)
        for step in range(4):
            fill_weights(model, step + 1.0)
            model[1].running_mean.fill_(step + 1.0)
            method.on_step_end(ctx, 0, step)
        finals.append(method.ema.module.state_dict())
    expected = 0.5 * (0.5 * (0.5 * 0.5 * 1 + 0.5 * 2) + 0.5 * 3) + 0.5 * 4  # 3.0625
    for name in ("0.weight", "1.running_mean"):
        assert torch.allclose(finals[1][name], torch.full_like(finals[1][name], expected)), name
        assert torch.equal(finals[0][name], finals[1][name]), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("avg_device, lives_on", [("cpu", "cpu"), ("train", "cuda")])
def test_the_ema_of_a_gpu_run_lives_where_run_avg_device_says(tmp_path, avg_device, lives_on):
    model = bn_model().cuda()
    ctx = make_ctx(model, tmp_path, device=torch.device("cuda", 0))
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False, avg_device=avg_device)
    method.on_train_start(ctx)
    fill_weights(model, 3.0)
    method.on_step_end(ctx, 0, 0)
    assert next(method.ema.module.parameters()).device.type == lives_on
    assert torch.equal(method.ema.module[0].weight.detach().cpu(), torch.full((3, 2), 2.0))  # (1 + 3) / 2


# ----------------------------------------------------------------------------- EMA: scoring and saving


def bn_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    fill_weights(model, 1.0)
    return model


def recompute_to(value: float, calls: list):
    def update_bn(model: nn.Module) -> None:  # stands in for a pass over the training data
        calls.append(model)
        model[1].running_mean.fill_(value)

    return update_bn


@pytest.mark.parametrize("device", [CPU, CPU0], ids=["on-the-training-device", "elsewhere"])
def test_ema_recompute_scores_recomputed_statistics_and_final_weights_keep_them(tmp_path, device):
    calls = []
    model = bn_model()
    ctx = make_ctx(model, tmp_path, device=device, update_bn=recompute_to(7.0, calls))
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False, bn="recompute")
    method.on_train_start(ctx)
    predictors = method.predictors(ctx)
    assert len(calls) == 1 and calls[0] is predictors["ema"].model is method.ema.module
    assert torch.equal(method.final_weights()["ema"]["1.running_mean"], torch.full((3,), 7.0))


def test_ema_average_scores_the_averaged_statistics_as_they_are(tmp_path):
    calls = []
    ctx = make_ctx(bn_model(), tmp_path, update_bn=recompute_to(7.0, calls))
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False, bn="average")
    method.on_train_start(ctx)
    method.predictors(ctx)
    assert calls == [] and torch.equal(method.final_weights()["ema"]["1.running_mean"], torch.zeros(3))


def test_ema_predictors_score_the_ema_as_ema_and_the_live_model_as_sgd(tmp_path):
    model = linear(1.0)
    ctx = make_ctx(model, tmp_path)
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False)
    method.on_train_start(ctx)
    fill_weights(model, 3.0)
    method.on_step_end(ctx, 0, 0)  # ema weights 2, live weights 3
    predictors = method.predictors(ctx)
    assert set(predictors) == {"ema", "sgd"}
    batches = [(X_TEST, torch.tensor([0, 1]))]
    with torch.no_grad():  # live: weights 3, bias 3; ema: weights (1 + 3) / 2, bias ([0, 1, -1] + 3) / 2
        torch.testing.assert_close(predictors["sgd"].predict_log_proba(batches), (X_TEST.sum(1, keepdim=True) * 3.0
                                                                                  + 3.0).expand(2, 3).log_softmax(1))
        torch.testing.assert_close(predictors["ema"].predict_log_proba(batches),
                                   (X_TEST.sum(1, keepdim=True) * 2.0 + torch.tensor([1.5, 2.0, 1.0])).log_softmax(1))


def test_ema_final_weights_are_a_snapshot_of_the_average(tmp_path):
    model = scalar(0.0)
    ctx = make_ctx(model, tmp_path, steps=2)
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False)
    assert method.final_weights() == {}  # nothing started: no average to save
    method.on_train_start(ctx)
    run_steps(method, ctx, {(0, 0): 4.0})
    final = method.final_weights()
    assert set(final) == {"ema"} and float(final["ema"]["weight"]) == 2.0
    run_steps(method, ctx, {(0, 1): 4.0})  # the average goes on; the snapshot does not
    assert float(final["ema"]["weight"]) == 2.0 and float(method.ema.module.weight.detach()) == 3.0


def test_an_ema_resumed_from_its_state_continues_exactly_as_the_uninterrupted_one(tmp_path):
    values = {(0, s): w for s, w in enumerate([1.0, -3.0, 0.5, 4.0, 2.0, -1.0])}

    def fresh(w0: float):
        ctx = make_ctx(scalar(w0), tmp_path, steps=6)
        method = EMA(Constant(lr=0.1), 1, decay=0.95, warmup=True)  # the warmup depends on the update count
        method.on_train_start(ctx)
        return method, ctx

    straight, ctx = fresh(5.0)
    run_steps(straight, ctx, values)

    first, ctx = fresh(5.0)
    run_steps(first, ctx, dict(list(values.items())[:3]))
    state = copy.deepcopy(first.state_dict())
    assert set(state) == {"ema", "updates"} and state["updates"] == 3
    resumed, ctx = fresh(0.5)  # the live weights as the checkpoint restores them; the EMA starts as their copy
    resumed.load_state_dict(state, ctx)
    assert resumed.updates == 3 and torch.equal(resumed.ema.module.weight, first.ema.module.weight)
    run_steps(resumed, ctx, dict(list(values.items())[3:]))
    assert resumed.updates == 6
    assert torch.equal(resumed.ema.module.weight, straight.ema.module.weight)


def test_an_ema_state_saved_before_training_started_holds_no_average_and_restores_none(tmp_path):
    state = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False).state_dict()
    assert state == {"ema": None, "updates": 0}
    ctx = make_ctx(scalar(3.0), tmp_path)
    method = EMA(Constant(lr=0.1), 1, decay=0.5, warmup=False)
    method.on_train_start(ctx)
    method.load_state_dict(state, ctx)
    assert float(method.ema.module.weight.detach()) == 3.0 and method.updates == 0


# ----------------------------------------------------------------------------- method=pretrained


def test_pretrained_refuses_random_starting_weights_naming_the_keys_that_load_trained_ones():
    with pytest.raises(ConfigError) as refused:
        Pretrained().validate(initialized=False)
    for text in ("method=pretrained", "random initialisation: set model.pretrained=true (timm models) or "
                 "model.init_from=<run or weights file>"):
        assert text in str(refused.value)
    Pretrained().validate(initialized=True)


def test_pretrained_trains_at_lr_0_on_every_step():
    method = Pretrained(Constant(lr=0.1, warmup_epochs=1), epochs=5)
    assert method.epochs == 0
    assert [method.lr_at(e, s, 3) for e in range(2) for s in range(3)] == [0.0] * 6
    assert [method.step_lr(e, s, 3) for e in range(2) for s in range(3)] == [0.0] * 6


def test_pretrained_scores_the_model_as_it_was_loaded_under_the_name_pretrained(tmp_path):
    model = linear(0.5)
    ctx = make_ctx(model, tmp_path)
    predictors = Pretrained().predictors(ctx)
    assert set(predictors) == {"pretrained"}
    got = predictors["pretrained"].predict_log_proba([(X_TEST, torch.tensor([0, 1]))])
    torch.testing.assert_close(got, (X_TEST @ torch.full((2, 3), 0.5) + torch.tensor([0.0, 1.0, -1.0])).log_softmax(1))
