"""One NLL, computed one way: what metrics.json says of a model equals its per-epoch test loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swalab.evaluate import (CachedEnsemble, ModelPredictor, ensemble_log_mean, mean_loss_and_accuracy,
                             metrics_from_log_probs)


class FixedLogits(nn.Module):
    """Ignores its input: returns the same logits for every image (a confidently wrong model)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, x):
        return self.logits[: len(x)]


def test_a_single_models_nll_equals_its_per_epoch_cross_entropy_even_when_it_is_very_sure_and_wrong():
    logits = torch.tensor([[60.0, 0.0, 0.0], [0.0, 3.0, 0.0]])  # image 0: p(true class 2) = e^-60, far below 1e-12
    labels = torch.tensor([2, 1])
    loader = [(torch.zeros(2, 1), labels)]
    model = FixedLogits(logits)
    metrics = metrics_from_log_probs(ModelPredictor(model, torch.device("cpu")).predict_log_proba(loader), labels)
    per_epoch_nll, _ = mean_loss_and_accuracy(model, loader, torch.device("cpu"), labels=labels)
    assert metrics["nll"] == pytest.approx(per_epoch_nll, rel=1e-6)
    expected = (60 + math.log(1 + 2 * math.exp(-60)) + math.log(2 + math.exp(3)) - 3) / 2  # by hand
    assert metrics["nll"] == pytest.approx(expected, rel=1e-6)  # a 1e-12 clamp made it (27.63 + 0.0949) / 2


def test_an_ensembles_nll_is_the_log_of_its_members_mean_probability_without_a_clamp():
    # two members, both sure the true class (0) is wrong: p = e^-100 and e^-102
    a = torch.tensor([[-100.0, 0.0]])
    b = torch.tensor([[-102.0, 0.0]])
    got = ensemble_log_mean([a, b])
    expected = math.log((math.exp(-100) + math.exp(-102)) / 2)  # = -100 + log((1 + e^-2) / 2)
    assert float(got[0, 0]) == pytest.approx(expected, rel=1e-6)
    metrics = CachedEnsemble([a, b]).curve(torch.tensor([0]))[-1]
    assert metrics["members"] == 2 and metrics["nll"] == pytest.approx(-expected, rel=1e-6)


def test_log_probabilities_and_cross_entropy_agree_on_a_real_network():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 300))  # 300 classes, as in the folder case that disagreed
    x, y = torch.randn(64, 3, 2, 2) * 8, torch.randint(0, 300, (64,))
    loader = [(x[:32], y[:32]), (x[32:], y[32:])]
    metrics = metrics_from_log_probs(ModelPredictor(model, torch.device("cpu")).predict_log_proba(loader), y)
    assert metrics["nll"] == pytest.approx(float(F.cross_entropy(model(x), y)), rel=1e-5)


def test_checkpoints_and_files_written_with_probabilities_still_load():
    from swalab.methods.fge import member_log_probs_of

    probs = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    [log_probs] = member_log_probs_of({"member_probs": [probs], "member_epochs": [3]})  # an earlier version's file
    torch.testing.assert_close(log_probs.exp(), probs)
    assert torch.isfinite(log_probs).all()  # a probability rounded to 0 is the smallest float, never -inf
