"""SWA, FGE and EMA driven through the real Trainer on tiny in-memory data (CPU, seconds).

Each test checks a method against a value computed independently of it: the SWA average against
the mean of live weights we capture ourselves, BN statistics against the data's moments, the FGE
ensemble against member softmaxes recomputed from the saved weights, the EMA against its closed
form, and a resumed run against an uninterrupted one.
"""

from __future__ import annotations

import copy

import json
import shutil

import pytest
import torch
from torch import nn

from swalab.checkpoint import checkpoint_paths
from swalab.data import DataSplit, ResidentLoader
from swalab.evaluate import metrics_from_probs, predict_logits
from swalab.methods import EMA, FGE, SWA, TrainContext
from swalab.methods.fge import MEMBER_PROBS_FILE
from swalab.schedules import Constant, PaperSGD
from swalab.config import ConfigError
from swalab.train import train, validate
from swalab.trainer import Trainer, TrainerOptions

CPU = torch.device("cpu")
CLASSES = 3


pytestmark = pytest.mark.usefixtures("one_thread")  # toy models gain nothing from threads, lose on a busy machine


def split(n: int, seed: int, channels: int = 2, size: int = 6) -> DataSplit:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)
    return DataSplit(images=images, labels=torch.randint(0, CLASSES, (n,), generator=g))


def toy_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, CLASSES))


def make_trainer(method, tmp_path, epochs: int, model: nn.Module | None = None, n_train: int = 48,
                 batch_size: int = 8, bn_batch_size: int | None = None, **options) -> Trainer:
    common = dict(device=CPU, mean=[0.5, 0.5], std=[0.25, 0.25])
    train_split = split(n_train, seed=1)
    train_loader = ResidentLoader(train_split, batch_size, train=True, pad=1, flip=True, seed=0, **common)
    test_loader = ResidentLoader(split(20, seed=2), 7, train=False, **common)
    bn_loader = ResidentLoader(train_split, bn_batch_size or batch_size, train=True, pad=1, flip=True,
                               drop_last=False, seed=1, **common)
    opts = TrainerOptions(epochs=epochs, progress=False, handle_signals=False, eval_every=0,
                          checkpoint_every=1000, **options)  # only the last epoch is checkpointed (fsync is slow)
    return Trainer(model or toy_net(), method, train_loader, test_loader, bn_loader, CPU, tmp_path, opts)


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def record_captures(method: SWA, trainer: Trainer) -> list[tuple[int, int | None, list[torch.Tensor]]]:
    """Wrap the SWA hooks: whenever the average grows, snapshot the live weights (epoch, step, params)."""
    captured = []
    on_step, on_epoch = method.on_step_end, method.on_epoch_end

    def step_hook(ctx, epoch, step):
        before = method.n_averaged
        on_step(ctx, epoch, step)
        if method.n_averaged > before:
            captured.append((epoch, step, params_of(trainer.model)))

    def epoch_hook(ctx, epoch):
        before = method.n_averaged
        on_epoch(ctx, epoch)
        if method.n_averaged > before:
            captured.append((epoch, None, params_of(trainer.model)))

    method.on_step_end, method.on_epoch_end = step_hook, epoch_hook
    return captured


def assert_average_is_mean(method: SWA, captured) -> None:
    assert method.n_averaged == len(captured) > 0
    for k, avg in enumerate(method.averaged.module.parameters()):
        expected = torch.stack([c[2][k] for c in captured]).mean(dim=0)
        torch.testing.assert_close(avg.detach(), expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- SWA


@pytest.mark.parametrize("swa_start, c_epochs", [(3, 1), (3, 2), (0, 2), (5, 1)])
def test_constant_swa_average_is_the_mean_of_the_weights_at_the_reference_capture_epochs(
        tmp_path, swa_start, c_epochs):
    epochs = 7
    method = SWA(PaperSGD(lr=0.1, horizon=epochs), epochs, start_epoch=swa_start, lr=0.03,
                 capture_every=c_epochs)
    trainer = make_trainer(method, tmp_path, epochs)
    captured = record_captures(method, trainer)
    trainer.fit()
    rule = [e for e in range(epochs) if e + 1 >= swa_start and (e + 1 - swa_start) % c_epochs == 0]
    assert [c[0] for c in captured] == rule
    assert_average_is_mean(method, captured)


def test_cyclic_swa_captures_at_every_cycle_end_and_averages_them(tmp_path):
    # 48 images / batch 8 = 6 steps per epoch; cycle 1.5 epochs = 9 iterations; 4 epochs of SWA = 24 iterations
    method = SWA(PaperSGD(lr=0.1, horizon=6), 6, start_epoch=2, lr=0.05, phase="cyclic", lr_min=0.005,
                 cycle_epochs=1.5)
    trainer = make_trainer(method, tmp_path, epochs=6)
    captured = record_captures(method, trainer)
    lrs = []
    lr_at = method.lr_at
    method.lr_at = lambda e, s, n: lrs.append((e, s, lr_at(e, s, n))) or lrs[-1][2]
    trainer.fit()
    iterations = [(e - 2) * 6 + s + 1 for e, s, _ in captured]
    assert iterations == [9, 18]
    assert [(e, s) for e, s, _ in captured] == [(3, 2), (4, 5)]
    assert_average_is_mean(method, captured)
    lr_of = {(e, s): lr for e, s, lr in lrs}
    for e, s, _ in captured:
        assert lr_of[(e, s)] == pytest.approx(0.005)  # captured at the lr minimum
    assert lr_of[(3, 3)] == pytest.approx(0.05 - 0.045 / 9)  # the jump back near a1


def test_bn_update_gives_the_exact_statistics_of_the_training_data(tmp_path):
    """A model that is only a BatchNorm layer: one pass gives the data's mean and unbiased variance."""
    bn = nn.BatchNorm2d(2)
    trainer = make_trainer(SWA(Constant(lr=0.1), 1, start_epoch=0, lr=0.1), tmp_path, epochs=1,
                           model=toy_net(), n_train=48, bn_batch_size=48)
    bn.running_mean.fill_(5.0)
    trainer.ctx.update_bn(bn)
    trainer.bn_loader.set_epoch(0)
    x = torch.cat([xb for xb, _ in trainer.bn_loader])
    per_channel = x.transpose(0, 1).reshape(2, -1)
    torch.testing.assert_close(bn.running_mean, per_channel.mean(dim=1))
    torch.testing.assert_close(bn.running_var, per_channel.var(dim=1, unbiased=True))
    assert bn.momentum == 0.1  # restored after the pass


def test_bn_update_over_several_batches_is_the_cumulative_average_of_batch_moments(tmp_path):
    bn = nn.BatchNorm2d(2)
    trainer = make_trainer(SWA(Constant(lr=0.1), 1, start_epoch=0, lr=0.1), tmp_path, epochs=1,
                           n_train=48, bn_batch_size=12)
    trainer.ctx.update_bn(bn)
    trainer.bn_loader.set_epoch(0)
    batches = [xb.transpose(0, 1).reshape(2, -1) for xb, _ in trainer.bn_loader]
    assert len(batches) == 4
    torch.testing.assert_close(bn.running_mean, torch.stack([b.mean(1) for b in batches]).mean(0))
    torch.testing.assert_close(bn.running_var, torch.stack([b.var(1) for b in batches]).mean(0))
    torch.testing.assert_close(bn.running_mean, torch.cat(batches, dim=1).mean(1))  # equal batches: exact mean


def test_scoring_swa_leaves_the_live_models_bn_buffers_bit_identical(tmp_path):
    method = SWA(PaperSGD(lr=0.1, horizon=4), 4, start=0.5, lr=0.05, score_every=1, score_at_budgets=[0.75])
    trainer = make_trainer(method, tmp_path, epochs=4)
    live_buffers = []
    on_epoch = method.on_epoch_end

    def hook(ctx, epoch):  # the live buffers right before and after SWA scores its average mid-training
        before = {k: v.clone() for k, v in trainer.model.named_buffers()}
        on_epoch(ctx, epoch)
        live_buffers.append((before, {k: v.clone() for k, v in trainer.model.named_buffers()}))

    method.on_epoch_end = hook
    metrics = trainer.fit().metrics
    for before, after in live_buffers:
        for name in before:
            assert torch.equal(before[name], after[name]), name
    before = {k: v.clone() for k, v in trainer.model.named_buffers()}
    swa_model = method.averaged_for_eval(trainer.ctx)
    for name, buf in trainer.model.named_buffers():
        assert torch.equal(before[name], buf), name
    # the average's statistics are one pass of its own weights over the BN-update data (epoch 0's batches)
    fresh = copy.deepcopy(method.averaged.module)
    for m in fresh.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    trainer.bn_loader.set_epoch(0)
    fresh.train()
    with torch.no_grad():
        for x, _ in trainer.bn_loader:
            fresh(x)
    torch.testing.assert_close(swa_model[1].running_mean, fresh[1].running_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(swa_model[1].running_var, fresh[1].running_var, rtol=0, atol=1e-6)
    assert not torch.equal(swa_model[1].running_mean, trainer.model[1].running_mean)
    assert {"swa", "sgd", "swa@0.75"} <= set(metrics)
    assert (method.start_epoch, metrics["swa@0.75"]["epoch"], metrics["swa@0.75"]["budget"]) == (2, 3, 0.75)
    assert (metrics["swa"]["epoch"], metrics["sgd"]["budget"]) == (4, 1.0)  # predictors carry what stands behind them
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert "swa_test_acc" in history[-1] and "swa_test_acc" not in history[0]


# ----------------------------------------------------------------------------- FGE


@pytest.mark.parametrize("cycle, epochs, expected_epochs", [(2, 8, [3, 5, 7]), (4, 10, [4, 8])])
def test_fge_collects_members_at_mid_cycle(tmp_path, cycle, epochs, expected_epochs):
    method = FGE(PaperSGD(lr=0.1, horizon=epochs), epochs, lr_max=0.05, lr_min=0.005, cycle_epochs=cycle,
                 pretrain_epochs=2, pre_schedule="base", save_members=True)
    trainer = make_trainer(method, tmp_path, epochs)
    metrics = trainer.fit().metrics
    assert [e + 1 for e in method.member_epochs] == expected_epochs
    assert metrics["fge"]["members"] == len(expected_epochs)
    assert metrics["fge"]["member_epochs"] == expected_epochs
    assert len(list((tmp_path / "members").glob("member_*.pt"))) == len(expected_epochs)


def test_fge_cached_ensemble_equals_the_mean_softmax_of_the_saved_members(tmp_path):
    method = FGE(PaperSGD(lr=0.1, horizon=8), 8, lr_max=0.05, lr_min=0.005, cycle_epochs=2, pretrain_epochs=2,
                 pre_schedule="base", save_members=True)
    trainer = make_trainer(method, tmp_path, epochs=8)
    metrics = trainer.fit().metrics
    member_probs = []
    for path in sorted((tmp_path / "members").glob("member_*.pt")):
        net = toy_net()
        net.load_state_dict(torch.load(path, weights_only=False)["model"])
        member_probs.append(predict_logits(net, trainer.test_loader, CPU).softmax(1))
    fresh = torch.stack(member_probs).mean(0)
    torch.testing.assert_close(method.ensemble.log_probs().exp(), fresh)
    saved = method.artifacts(trainer.ctx)[MEMBER_PROBS_FILE]  # train.py writes it to the run directory
    torch.testing.assert_close(torch.stack(saved["member_log_probs"]).exp().mean(0), fresh)
    assert saved["member_epochs"] == [3, 5, 7] and torch.equal(saved["labels"], trainer.test_labels)
    ensemble_metrics = metrics_from_probs(fresh, trainer.test_labels)
    last = metrics["fge"]["curve"][-1]
    assert last["members"] == 3
    for key in ("acc", "nll", "ece"):
        assert last[key] == pytest.approx(metrics["fge"][key]) == pytest.approx(ensemble_metrics[key], abs=1e-5)


# ----------------------------------------------------------------------------- EMA


def scalar_ctx(model: nn.Module, tmp_path, steps: int) -> TrainContext:
    return TrainContext(model=model, device=CPU, epochs=1, steps_per_epoch=steps, run_dir=tmp_path,
                        update_bn=lambda m: None, test_log_probs=lambda m: torch.zeros(1, 2),
                        test_labels=torch.zeros(1, dtype=torch.long))


def run_ema(method: EMA, tmp_path, values: list[float], w0: float = 2.0) -> float:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(w0)
    ctx = scalar_ctx(model, tmp_path, len(values))
    method.on_train_start(ctx)
    for step, w in enumerate(values):
        with torch.no_grad():
            model.weight.fill_(w)
        method.on_step_end(ctx, 0, step)
    return float(method.ema.module.weight.detach())


def test_ema_without_warmup_is_the_closed_form_geometric_sum(tmp_path):
    d, w0, values = 0.9, 2.0, [1.0, -3.0, 0.5, 4.0, 0.0, 7.0]
    got = run_ema(EMA(Constant(lr=0.1), 1, decay=d, warmup=False), tmp_path, values, w0)
    k = len(values)
    expected = d ** k * w0 + (1 - d) * sum(d ** (k - j) * w for j, w in enumerate(values, start=1))
    assert got == pytest.approx(expected, rel=1e-6)


def test_ema_first_update_without_warmup_lerps_from_the_initial_weights(tmp_path):
    # timm ModelEmaV3.update(model, step=None) uses the fixed decay from the very first update
    assert run_ema(EMA(Constant(lr=0.1), 1, decay=0.9, warmup=False), tmp_path, [1.0], w0=2.0) == pytest.approx(1.9)


def test_ema_with_warmup_copies_first_then_ramps_the_decay(tmp_path):
    values = [1.0, -3.0, 0.5, 4.0]
    got = run_ema(EMA(Constant(lr=0.1), 1, decay=0.99, warmup=True, warmup_gamma=1.0, warmup_power=2 / 3),
                  tmp_path, values)
    ema = None
    for k, w in enumerate(values, start=1):  # timm: step k uses decay 1 - (1 + (k - 1))^-p, 0 at k = 1
        decay = 0.0 if k == 1 else min(1 - (1 + (k - 1)) ** (-2 / 3), 0.99)
        ema = w if ema is None else decay * ema + (1 - decay) * w
    assert got == pytest.approx(ema, rel=1e-6)


def test_ema_updates_only_every_n_steps(tmp_path):
    d, w0, values = 0.5, 0.0, [1.0, 2.0, 3.0, 4.0, 5.0]
    got = run_ema(EMA(Constant(lr=0.1), 1, decay=d, warmup=False, update_every=2), tmp_path, values, w0)
    expected = d * (d * w0 + (1 - d) * 2.0) + (1 - d) * 4.0  # updates after steps 2 and 4
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("bn", ["average", "recompute"])
@pytest.mark.parametrize("warmup", [False, True])
def test_the_ema_over_cached_tensor_lists_equals_timms_model_ema_v3_bit_for_bit(tmp_path, bn, warmup):
    """The per-step update over tensor lists paired once (``EmaTensors``) is ModelEmaV3's, without its two
    state_dict() and per-buffer copies each step."""
    from timm.utils import ModelEmaV3

    from swalab.models import PreResNet

    torch.manual_seed(0)
    model = PreResNet(depth=8, num_classes=10, in_channels=3)
    ctx = TrainContext(model=model, device=torch.device("cpu"), epochs=1, steps_per_epoch=6, run_dir=tmp_path,
                       update_bn=lambda m: None, test_log_probs=lambda m: None, test_labels=torch.zeros(1))
    ours = EMA(Constant(lr=0.1), 1, decay=0.9, warmup=warmup, bn=bn)
    ours.on_train_start(ctx)
    assert ours.tensors is not None  # the cached path is the one under test
    timm = ModelEmaV3(model, decay=0.9, use_warmup=warmup, exclude_buffers=bn == "recompute")
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        with torch.no_grad():  # the model moves: new weights, new BN statistics, one more batch tracked
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            model.train()(torch.randn(4, 3, 8, 8, generator=g))
        ours.on_step_end(ctx, 0, step)
        timm.update(model, step=step + 1 if warmup else None)
        for name, value in timm.module.state_dict().items():
            assert torch.equal(ours.ema.module.state_dict()[name], value), (step, name)


# ----------------------------------------------------------------------------- resume mid-averaging


@pytest.mark.slow
def test_resume_in_the_middle_of_averaging_gives_the_same_swa_weights(make_cfg, tmp_path):
    overrides = ["method=swa", "dataset.train_size=64", "model.budget_epochs=4", "model.swa.start_epoch=3",
                 "trainer.batch_size=32", "run.keep_checkpoints=20", "run.keep_finished_checkpoints=true",
                 "run.eval_every=0"]
    straight = tmp_path / "straight"
    train(make_cfg(*overrides), run_dir=straight)  # 6 epochs, captures after epochs 3, 4, 5, 6
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(straight, resumed_dir)
    for name in ("metrics.json", "final.pt"):
        (resumed_dir / name).unlink()
    for path in checkpoint_paths(resumed_dir / "checkpoints")[:2]:  # drop epochs 6 and 5: resume from 4
        path.unlink()
    mid = torch.load(resumed_dir / "checkpoints" / "epoch0004.pt", weights_only=False)
    assert int(mid["method"]["averaged"]["n_averaged"]) == 2
    train(make_cfg(*overrides), run_dir=resumed_dir)
    a = torch.load(straight / "final.pt", weights_only=False)["methods"]["swa"]
    b = torch.load(resumed_dir / "final.pt", weights_only=False)["methods"]["swa"]
    for run in (straight, resumed_dir):
        assert json.loads((run / "metrics.json").read_text())["swa"]["n_averaged"] == 4
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("overrides, key", [
    (["method=swa", "model.swa.start_epoch=30", "trainer.epochs=24"], "model.swa.start"),
    (["method=swa", "model.swa.start=1.6", "trainer.epochs=24"], "model.swa.start"),
    (["method=fge", "model.fge.cycle_epochs=3", "model.init_from=x"], "model.fge.cycle_epochs"),
    (["method=swa", "model.swa.phase=cyclic", "model.swa.lr_min=0.001", "model.swa.cycle_epochs=20",
      "model.swa.start_epoch=10", "trainer.epochs=24"], "model.swa.cycle_epochs"),
    (["method=fge", "model.fge.pretrain=0"], "model.init_from"),
    (["method=swa", "model.swa.start_epoch=0", "model.swa.capture_every=30", "trainer.epochs=24"],
     "model.swa.capture_every"),
    (["method=swa", "model.swa.capture_every=1.5"], "model.swa.capture_every"),
    (["method=ema", "method.decay=1.5"], "method.decay"),
])
def test_bad_settings_fail_before_training_naming_the_key(make_cfg, tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(make_cfg(*overrides))
    run_dir = tmp_path / "run"  # train() checks the same before anything is written
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train(make_cfg(*[o for o in overrides if not o.startswith("model.init_from")]), run_dir=run_dir)
    assert not run_dir.exists()


@pytest.mark.parametrize("epochs, start, pretrain", [(6, 3, 5), (24, 13, 19), (60, 32, 48)])
def test_swa_start_and_fge_pretraining_scale_with_the_run(make_cfg, epochs, start, pretrain):
    """Fractions of the budget B = trainer.epochs / method.budget: a short grid works for every method."""
    swa = validate(make_cfg("method=swa", f"trainer.epochs={epochs}"))  # digits: start 0.8125 of B, budget 1.5
    fge = validate(make_cfg("method=fge", f"trainer.epochs={epochs}"))  # pretrain 0.8 of B, budget 1
    assert (swa.start_epoch, fge.pretrain_epochs) == (start, pretrain)


def test_the_swa_average_is_in_every_epochs_line_with_score_every_budget_marks_included(tmp_path):
    method = SWA(PaperSGD(lr=0.1, horizon=4), 4, start=0.25, lr=0.05, score_every=1, score_at_budgets=[0.75])
    trainer = make_trainer(method, tmp_path, epochs=4)
    metrics = trainer.fit().metrics
    scored = {row["epoch"]: row["swa_test_acc"] for row in trainer.history if "swa_test_acc" in row}
    assert sorted(scored) == [1, 2, 3, 4]                              # epoch 3 is the 0.75 mark: its line has it too
    assert scored[3] == pytest.approx(metrics["swa@0.75"]["acc"])      # the same scoring, once
    assert scored[4] == pytest.approx(metrics["swa"]["acc"])
