"""Your recipe: the optimizer group, the training loss (label smoothing, mixup/cutmix), and what they leave alone.

Each piece is checked on its own here against a hand computation or torch's own class; the end-to-end runs with
these recipes (exact resume, the paper's recipe unchanged) are at the end of the file.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swalab.config import ConfigError
from swalab.losses import LossSpec
from swalab.optim import OptimizerSpec, param_groups


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


# -- the optimizer ---------------------------------------------------------------------------------------------
def test_the_default_optimizer_is_torchs_sgd_with_the_papers_settings_in_one_group():
    model = net()
    opt = OptimizerSpec("torch.optim.SGD", {"momentum": 0.9, "weight_decay": 3e-4, "nesterov": False}).build(model, 0.1)
    assert type(opt) is torch.optim.SGD and len(opt.param_groups) == 1
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (0.1, 0.9, 3e-4, False)
    assert group["params"] == list(model.parameters())  # the order a checkpoint's optimizer state relies on


def test_filter_bias_and_bn_exempts_exactly_the_one_dimensional_parameters_from_decay():
    model = net()
    decayed, exempt = param_groups(model, 0.05, filter_bias_and_bn=True)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decayed["params"]) == ["0.weight", "3.weight"]
    assert sorted(names[id(p)] for p in exempt["params"]) == ["0.bias", "1.bias", "1.weight", "3.bias"]
    assert (decayed["weight_decay"], exempt["weight_decay"]) == (0.05, 0.0)


def test_adamw_takes_its_own_settings_and_any_torch_optimizer_works_through_its_target():
    opt = OptimizerSpec("torch.optim.AdamW", {"betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.05}).build(net(), 1e-3)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["betas"] == (0.9, 0.95)
    rms = OptimizerSpec("torch.optim.RMSprop", {"alpha": 0.9}).build(net(), 1e-3)
    assert type(rms) is torch.optim.RMSprop and rms.param_groups[0]["alpha"] == 0.9


@pytest.mark.parametrize("target, settings, message", [
    ("torch.optim.SGD", {"momentum": float("nan")}, "optimizer.momentum=nan must be a finite number"),
    ("torch.optim.SGD", {"momentum": 1.0}, "optimizer.momentum=1.0 must be in [0, 1)"),
    ("torch.optim.SGD", {"weight_decay": -1e-4}, "optimizer.weight_decay=-0.0001 must be >= 0"),
    ("torch.optim.AdamW", {"betas": [0.9, float("inf")]}, "optimizer.betas=inf must be a finite number"),
    ("torch.optim.AdamW", {"betas": [0.9, 1.5]}, "optimizer (torch.optim.AdamW) refuses its settings"),
    ("torch.optim.AdamW", {"momentum": 0.9}, "optimizer.momentum is not a setting of torch.optim.AdamW"),
    ("torch.optim.SGD", {"lr": 0.1}, "optimizer.lr: the learning rate is the method's"),
    ("torch.optim.Nope", {}, "optimizer._target_='torch.optim.Nope' cannot be imported"),
    ("torch.nn.Linear", {}, "is not a torch.optim.Optimizer class"),
])
def test_a_bad_optimizer_setting_is_refused_naming_its_key(target, settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        OptimizerSpec(target, settings).check()


# -- the loss --------------------------------------------------------------------------------------------------
def test_plain_cross_entropy_is_the_default_and_label_smoothing_is_torchs():
    logits, y = torch.randn(8, 5, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    plain = LossSpec().build(5)
    assert torch.equal(plain(logits, y), F.cross_entropy(logits, y))
    smooth = LossSpec(label_smoothing=0.1).build(5)
    by_hand = -(((1 - 0.1) * F.one_hot(y, 5) + 0.1 / 5) * logits.log_softmax(1)).sum(1).mean()
    torch.testing.assert_close(smooth(logits, y), by_hand)


def test_mixup_mixes_each_batch_with_itself_reversed_and_targets_follow():
    np.random.seed(0)
    loss = LossSpec(mixup_alpha=0.4).build(3)
    x = torch.arange(4 * 2, dtype=torch.float32).view(4, 2, 1, 1)
    y = torch.tensor([0, 1, 2, 0])
    mixed, target = loss.prepare(x.clone(), y)
    np.random.seed(0)
    assert np.random.rand() < 1.0  # timm's draw for mix_prob, then one lambda for the batch
    lam = float(np.random.beta(0.4, 0.4))
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.flip(0))
    torch.testing.assert_close(target, lam * F.one_hot(y, 3).float() + (1 - lam) * F.one_hot(y.flip(0), 3).float())
    logits = torch.randn(4, 3)
    torch.testing.assert_close(loss(logits, target), -(target * logits.log_softmax(1)).sum(1).mean())


def test_an_odd_batch_is_mixed_but_for_its_last_image_which_keeps_its_label():
    np.random.seed(1)
    loss = LossSpec(cutmix_alpha=1.0, label_smoothing=0.1).build(4)
    x, y = torch.randn(5, 3, 8, 8), torch.tensor([0, 1, 2, 3, 1])
    last = x[4].clone()
    mixed, target = loss.prepare(x, y)
    assert mixed.shape == (5, 3, 8, 8) and torch.equal(mixed[4], last)
    torch.testing.assert_close(target[4], torch.tensor([0.025, 0.925, 0.025, 0.025]))
    torch.testing.assert_close(target.sum(1), torch.ones(5))


def test_train_accuracy_of_soft_targets_counts_the_class_of_most_weight():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])
    soft = torch.tensor([[0.7, 0.3, 0.0], [0.6, 0.4, 0.0], [0.0, 0.45, 0.55]])
    assert int(LossSpec().build(3).correct(logits, soft)) == 2
    assert int(LossSpec().build(3).correct(logits, torch.tensor([0, 0, 2]))) == 2


@pytest.mark.parametrize("settings, message", [
    ({"label_smoothing": float("nan")}, "loss.label_smoothing=nan must be a finite number"),
    ({"label_smoothing": 1.0}, "loss.label_smoothing=1.0 must be in [0, 1)"),
    ({"mixup_alpha": -0.2}, "loss.mixup_alpha=-0.2 must be >= 0"),
    ({"mix_mode": "row"}, "loss.mix_mode='row' must be one of batch, pair, elem"),
    ({"cutmix_alpha": 1.0, "mix_prob": 0.0}, "loss.mix_prob=0 with mixup or cutmix on would never mix a batch"),
])
def test_a_bad_loss_setting_is_refused_naming_its_key(settings, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        LossSpec(**settings)


# -- the training step: accumulation, clipping, precision -----------------------------------------------------
def trainer_for(run_dir, model: nn.Module, options: dict, optimizer: OptimizerSpec | None = None,
                batch: int = 32, epochs: int = 2, method=None):
    from swalab.data import ResidentLoader
    from swalab.methods import SGD
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions
    from test_rank_agreement import toy_data

    common = dict(device=CPU, mean=[0.5], std=[0.25])
    train = ResidentLoader(toy_data(), batch, train=True, pad=1, flip=False, seed=3, **common)
    test = ResidentLoader(toy_data(64), 64, train=False, **common)
    opts = TrainerOptions(epochs=epochs, progress=False, handle_signals=False, eval_every=0, **options)
    return Trainer(model, method or SGD(Constant(lr=0.05), epochs), train, test, test, CPU, run_dir, opts,
                   optimizer=optimizer or OptimizerSpec(settings={"momentum": 0.9, "weight_decay": 1e-4}))


CPU = torch.device("cpu")


def no_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 4))


def test_accumulating_two_micro_batches_of_64_equals_one_batch_of_128_for_a_model_without_bn(tmp_path):
    whole = trainer_for(tmp_path / "whole", no_bn_model(), {"accumulate": 1}, batch=128)
    halves = trainer_for(tmp_path / "halves", no_bn_model(), {"accumulate": 2}, batch=128)
    whole_metrics, halves_metrics = whole.fit().metrics, halves.fit().metrics
    for (name, a), b in zip(whole.model.state_dict().items(), halves.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)  # equal up to the order of float sums
        assert not torch.equal(a, b) or a.numel() < 8  # (and it did take another path)
    assert [r["train_loss"] for r in whole.history] == pytest.approx([r["train_loss"] for r in halves.history], rel=1e-5)
    assert whole_metrics["sgd"]["acc"] == halves_metrics["sgd"]["acc"]


def test_clip_grad_norm_scales_the_step_to_the_norm_it_names(tmp_path):
    plain = OptimizerSpec(settings={})  # SGD without momentum or decay: the step is -lr x the (clipped) gradient
    runs = {}
    for clip in (None, 1e-3):
        trainer = trainer_for(tmp_path / str(clip), no_bn_model(), {"clip_grad_norm": clip}, optimizer=plain, epochs=1)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train_loader.set_epoch(0)
        x, y = next(iter(trainer.train_loader))
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.step.forward_backward(x, y)
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        trainer.step.update()
        runs[clip] = (before, grads, [p.detach().clone() for p in trainer.model.parameters()])
    before, grads, after = runs[1e-3]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert norm > 1e-3  # the clip acts
    step = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a - b) for a, b in zip(after, before)]))
    assert float(step) == pytest.approx(0.05 * 1e-3, rel=1e-3)  # lr x the named norm
    before, grads, after = runs[None]
    for a, b, g in zip(after, before, grads):
        torch.testing.assert_close(a, b - 0.05 * g)


def test_fp16_trains_with_a_gradient_scaler_whose_overflowed_steps_are_skipped_not_failed(tmp_path):
    trainer = trainer_for(tmp_path / "fp16", no_bn_model(), {"precision": "fp16"}, epochs=1)
    assert trainer.step.scaler is not None
    trainer.step.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 120)  # the first steps' gradients overflow in fp16
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train_loader.set_epoch(0)
    x, y = next(iter(trainer.train_loader))
    trainer.optimizer.zero_grad(set_to_none=True)
    loss, _ = trainer.step.forward_backward(x, y)
    assert torch.isfinite(loss)  # the loss is fine; its scaled gradients are not
    trainer.step.update()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # the scaler skipped the step
    assert trainer.step.scaler.get_scale() < 2.0 ** 120  # and lowered its scale
    evaluation = trainer.fit()  # the whole run trains on and finishes
    assert evaluation.metrics["sgd"]["acc"] >= 0 and "scaler" in trainer.state(1, 0)


def test_bf16_and_fp16_steps_run_under_autocast_and_fp32_and_auto_on_cpu_do_not(tmp_path, monkeypatch):
    seen = {}
    for precision in ("auto", "fp32", "bf16", "fp16"):
        trainer = trainer_for(tmp_path / precision, no_bn_model(), {"precision": precision}, epochs=1)
        def record(module, args, out, p=precision) -> None:  # (a hook that returns a value replaces the output)
            seen.setdefault(p, (torch.is_autocast_enabled("cpu"), out.dtype))

        trainer.forward_model.register_forward_hook(record)
        trainer.fit()
    assert seen == {"auto": (False, torch.float32), "fp32": (False, torch.float32),
                    "bf16": (True, torch.bfloat16), "fp16": (True, torch.float16)}


def test_a_bad_precision_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="trainer.precision='fp8' must be one of auto, bf16, fp16, fp32"):
        trainer_for(tmp_path, no_bn_model(), {"precision": "fp8"})


def test_with_mixup_the_bn_update_and_every_score_see_clean_images(tmp_path):
    """Mixing is the training step's alone: the average's BN statistics and its scores are those of the clean BN
    and test loaders, recomputed here without the trainer."""
    import copy

    import numpy as np

    from swalab.evaluate import metrics_from_log_probs, predict_log_probs, recompute_bn
    from swalab.methods import SWA
    from swalab.schedules import Constant
    from swalab.trainer import Trainer, TrainerOptions
    from test_rank_agreement import bn_model

    np.random.seed(0)
    method = SWA(Constant(lr=0.05), 3, lr=0.02, start_epoch=1)
    base = trainer_for(tmp_path / "mixed", bn_model(), {}, epochs=3, method=method)
    trainer = Trainer(base.model, method, base.train_loader, base.test_loader, base.bn_loader, CPU, tmp_path / "run",
                      TrainerOptions(epochs=3, progress=False, handle_signals=False, eval_every=0),
                      loss=LossSpec(mixup_alpha=0.4, cutmix_alpha=1.0).build(4))
    metrics = trainer.fit().metrics
    average = copy.deepcopy(method.averaged.module)
    recompute_bn(average, trainer.bn_loader, CPU)
    for name, value in method.averaged.module.state_dict().items():
        assert torch.equal(average.state_dict()[name], value), name
    fresh = metrics_from_log_probs(predict_log_probs(average, trainer.test_loader, CPU), trainer.test_labels)
    assert fresh == {k: v for k, v in metrics["swa"].items() if k in fresh}


# -- where the averages live --------------------------------------------------------------------------------
@pytest.mark.parametrize("method_name", ["swa", "ema"])
def test_an_average_kept_on_the_cpu_gives_the_same_run(tmp_path, method_name):
    from swalab.methods import EMA, SWA
    from swalab.schedules import Constant
    from test_rank_agreement import bn_model

    def run(where):
        method = (SWA(Constant(lr=0.05), 3, lr=0.02, start_epoch=1, avg_device=where) if method_name == "swa"
                  else EMA(Constant(lr=0.05), 3, decay=0.9, avg_device=where))
        trainer = trainer_for(tmp_path / where, bn_model(), {}, epochs=3, method=method)
        metrics = trainer.fit().metrics
        average = method.averaged.module if method_name == "swa" else method.ema.module
        return metrics, average.state_dict(), next(average.parameters()).device

    on_train, on_cpu = run("train"), run("cpu")
    assert on_cpu[2].type == "cpu" and on_train[0] == on_cpu[0]
    assert all(torch.equal(a, b) for a, b in zip(on_train[1].values(), on_cpu[1].values()))


def test_a_bad_avg_device_is_refused_naming_the_run_key():
    from swalab.methods import SWA
    from swalab.schedules import Constant

    with pytest.raises(ConfigError, match="run.avg_device='gpu' must be 'train'"):
        SWA(Constant(lr=0.05), 3, lr=0.02, start_epoch=1, avg_device="gpu")


# -- whole runs --------------------------------------------------------------------------------------------------
MODERN = ["optimizer=adamw", "model.lr=0.003", "model.weight_decay=0.05", "optimizer.filter_bias_and_bn=true",
          "loss.label_smoothing=0.1", "loss.mixup_alpha=0.4", "loss.cutmix_alpha=1.0", "schedule=cosine",
          "schedule.warmup_epochs=1", "trainer.clip_grad_norm=5", "trainer.accumulate=2", "trainer.precision=bf16",
          "method=swa", "model.swa.pre_schedule=base", "model.swa.start_epoch=2", "model.swa.lr=0.001",
          "trainer.epochs=4", "dataset.train_size=256", "trainer.batch_size=64", "model.arch.depth=8"]


def test_a_run_with_every_recipe_option_pauses_and_resumes_bit_equal(tmp_path, make_cfg, monkeypatch, one_thread):
    """AdamW's moments, the mixup draws (numpy's generator), the warmup's step count and the bf16 steps all come back
    from a mid-epoch checkpoint: the resumed run ends with the weights of the one that ran straight through."""
    from swalab import faults
    from swalab.train import train
    from swalab.pausing import Preempted

    straight = train(make_cfg(*MODERN), run_dir=tmp_path / "straight")
    faults.reset()  # the hit counts of earlier tests in this process
    monkeypatch.setenv(faults.ENV, "train_step:6:TERM")  # step 2 of epoch 2
    with pytest.raises(Preempted):
        train(make_cfg(*MODERN), run_dir=tmp_path / "paused")
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    assert train(make_cfg(*MODERN), run_dir=tmp_path / "paused") == straight
    a = torch.load(tmp_path / "straight" / "final.pt", weights_only=False)
    b = torch.load(tmp_path / "paused" / "final.pt", weights_only=False)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["methods"]["swa"][k], b["methods"]["swa"][k]) for k in a["methods"]["swa"])
    history = [json.loads(line) for line in (tmp_path / "straight" / "history.jsonl").read_text().splitlines()]
    cosine = [0.003 * (1 + math.cos(math.pi * (e + 3 / 4) / 4)) / 2 for e in (0, 1)]  # each epoch's last of 4 steps,
    assert [row["lr"] for row in history[:2]] == pytest.approx(cosine)  # the warmup's last step reached the cosine


def test_an_fp16_run_pauses_and_resumes_bit_equal_with_its_loss_scale(tmp_path, make_cfg, monkeypatch, one_thread):
    """fp16 keeps a GradScaler whose scale and growth tracker change the steps it takes: both come back from a
    mid-epoch checkpoint, so the last checkpoint's scaler and the final weights equal the straight run's."""
    from swalab import faults
    from swalab.train import train
    from swalab.pausing import Preempted

    fp16 = [*[o for o in MODERN if not o.startswith("trainer.precision=")], "trainer.precision=fp16",
            "run.keep_finished_checkpoints=true"]  # the last checkpoints' scalers are compared below
    straight = train(make_cfg(*fp16), run_dir=tmp_path / "straight")
    faults.reset()
    monkeypatch.setenv(faults.ENV, "train_step:6:TERM")  # step 2 of epoch 2
    with pytest.raises(Preempted):
        train(make_cfg(*fp16), run_dir=tmp_path / "paused")
    paused_at = torch.load(next((tmp_path / "paused" / "checkpoints").glob("*_step*.pt")), weights_only=False)
    assert paused_at["scaler"]["_growth_tracker"] > 0  # the tracker counted steps: restarting it would change the run
    monkeypatch.delenv(faults.ENV)
    faults.reset()
    assert train(make_cfg(*fp16), run_dir=tmp_path / "paused") == straight
    last = [torch.load(max((tmp_path / run / "checkpoints").glob("epoch*.pt")), weights_only=False)
            for run in ("straight", "paused")]
    assert last[0]["scaler"] == last[1]["scaler"]
    a, b = (torch.load(tmp_path / run / "final.pt", weights_only=False)["model"] for run in ("straight", "paused"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_paper_recipe_is_the_default_and_every_recipe_key_names_its_run(make_cfg, tmp_path):
    from test_run_identity import plan_of

    cfg = make_cfg()
    assert (cfg.optimizer._target_, cfg.optimizer.momentum, cfg.optimizer.nesterov) == ("torch.optim.SGD", 0.9, False)
    assert (cfg.loss.label_smoothing, cfg.loss.mixup_alpha, cfg.loss.cutmix_alpha) == (0.0, 0.0, 0.0)
    assert (cfg.schedule.warmup_epochs, cfg.trainer.precision, cfg.trainer.accumulate) == (0.0, "auto", 1)
    assert cfg.trainer.clip_grad_norm is None
    typed = ["optimizer=adamw", "optimizer.filter_bias_and_bn=true", "loss.label_smoothing=0.1", "trainer.accumulate=2"]
    name = plan_of(tmp_path, *typed).run_dir.parent.name
    assert name == "optimizer-adamw+loss.label_smoothing-0.1+optimizer.filter_bias_and_bn-True+trainer.accumulate-2"


def test_a_run_of_an_earlier_swalab_reads_as_the_paper_recipe_and_its_old_keys_name_the_new_ones():
    from swalab.compat import moved_keys, upgraded, upgraded_config

    old = {"trainer": {"amp": False, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": False, "batch_size": 128}}
    config = upgraded_config(old)
    assert config["optimizer"] == {"_target_": "torch.optim.SGD", "filter_bias_and_bn": False, "momentum": 0.9,
                                   "weight_decay": 5e-4, "nesterov": False}
    assert config["trainer"] == {"batch_size": 128, "precision": "fp32", "clip_grad_norm": None, "accumulate": 1}
    assert config["loss"]["label_smoothing"] == 0.0 and config["schedule"]["warmup_epochs"] == 0.0
    identity = upgraded({"trainer.amp": True, "trainer.momentum": 0.9, "seed": 0})
    assert (identity["trainer.precision"], identity["optimizer.momentum"]) == ("auto", 0.9)
    assert identity["optimizer._target_"] == "torch.optim.SGD" and identity["trainer.accumulate"] == 1
    assert moved_keys(["trainer.amp=false", "trainer.momentum=0.5"]) == [
        "trainer.amp is now trainer.precision: write trainer.precision=fp32",
        "trainer.momentum is now optimizer.momentum: write optimizer.momentum=0.5"]
