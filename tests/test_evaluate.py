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


def test_accuracy_nll_ece_and_top5_equal_a_hand_computation():
    from swalab.evaluate import expected_calibration_error, metrics_from_probs

    # six classes, four images (rows sum to 1; no ties)
    probs = torch.tensor([[0.50, 0.20, 0.12, 0.09, 0.05, 0.04],    # label 0: right, conf 0.50, label 1st
                          [0.02, 0.90, 0.03, 0.025, 0.015, 0.01],  # label 2: wrong, conf 0.90, label 2nd
                          [0.35, 0.05, 0.06, 0.20, 0.30, 0.04],    # label 5: wrong, conf 0.35, label 6th (last)
                          [0.10, 0.09, 0.60, 0.11, 0.05, 0.05]],   # label 2: right, conf 0.60, label 1st
                         dtype=torch.float64)
    labels = torch.tensor([0, 2, 5, 2])
    m = metrics_from_probs(probs, labels)
    assert m["acc"] == pytest.approx(50.0)                          # 2 of 4
    assert m["top5"] == pytest.approx(75.0)                         # all but image 2
    assert m["nll"] == pytest.approx(-(math.log(0.5) + math.log(0.03) + math.log(0.04) + math.log(0.6)) / 4, rel=1e-5)
    # 15 equal bins of width 1/15: 0.35 -> bin 5 (acc 0), 0.5 -> bin 7 (acc 1), 0.6 -> bin 8 (acc 1), 0.9 -> bin 13 (acc 0)
    expected_ece = (abs(0 - 0.35) + abs(1 - 0.5) + abs(1 - 0.6) + abs(0 - 0.9)) / 4  # = 0.5375
    assert m["ece"] == pytest.approx(expected_ece, rel=1e-5)
    assert expected_calibration_error(probs.float(), labels) == pytest.approx(0.5375, rel=1e-5)


def test_two_images_in_one_ece_bin_are_averaged_before_the_gap_is_taken():
    from swalab.evaluate import metrics_from_probs

    probs = torch.tensor([[0.62, 0.38], [0.64, 0.36]])  # both in bin 9 (0.6 .. 0.667): one right, one wrong
    m = metrics_from_probs(probs, torch.tensor([0, 1]))
    assert m["ece"] == pytest.approx(abs(0.5 - 0.63), rel=1e-5)  # |mean acc - mean conf| weighted by 2/2, not 0.5


def test_an_ensemble_is_the_mean_of_its_members_probabilities():
    from swalab.evaluate import ensemble_mean

    a = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    b = torch.tensor([[0.5, 0.5], [0.6, 0.4]])
    torch.testing.assert_close(ensemble_mean([a, b]), torch.tensor([[0.7, 0.3], [0.4, 0.6]]))
    torch.testing.assert_close(ensemble_log_mean([a.log(), b.log()]).exp(), torch.tensor([[0.7, 0.3], [0.4, 0.6]]))
