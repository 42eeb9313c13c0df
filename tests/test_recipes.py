"""Your recipe: the optimizer group, the training loss (label smoothing, mixup/cutmix), and what they leave alone.

Each piece is checked on its own here against a hand computation or torch's own class; the end-to-end runs with
these recipes (exact resume, the paper's recipe unchanged) are at the end of the file.
"""

from __future__ import annotations

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
