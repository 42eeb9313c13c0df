"""One NLL, computed one way: what metrics.json says of a model equals its per-epoch test loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from swalab.evaluate import (CachedEnsemble, CachedLogProbs, ModelPredictor, ensemble_log_mean, ensemble_mean,
                             expected_calibration_error, labels_of, mean_loss_and_accuracy, metrics_from_log_probs,
                             metrics_from_probs, metrics_table, reliability_bins, val_log_probs_of)

CPU = torch.device("cpu")


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


def test_files_written_with_probabilities_are_upgraded_to_finite_log_probabilities():
    from swalab.upgrade import todays_method_state

    probs = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    _, files, _ = todays_method_state({"member_probs": [probs], "member_epochs": [3]})  # an earlier version's state
    [log_probs] = files.values()
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


def test_the_brier_score_equals_a_hand_computation():
    from swalab.evaluate import metrics_from_probs

    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    m = metrics_from_probs(probs, torch.tensor([0, 1]))
    # image 0: (0.7-1)^2 + 0.2^2 + 0.1^2 = 0.14; image 1: 0.1^2 + (0.3-1)^2 + 0.6^2 = 0.86
    assert m["brier"] == pytest.approx((0.14 + 0.86) / 2, rel=1e-6)


# ============================================================================= written out by hand (docs/mutation.md)
# Every expected number below is computed in the comment next to it, not by calling the code under test; each test
# kills mutants that survived mutmut's first run on this module.


class CountingLoader:
    """One batch of (x, y); counts how many times it was read."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.batch, self.passes = (x, y), 0

    def __iter__(self):
        self.passes += 1
        return iter([self.batch])


# ----------------------------------------------------------------------------- per-epoch loss and accuracy


def test_per_epoch_loss_and_accuracy_read_the_labels_from_the_loader_when_not_given():
    logits = torch.tensor([[60.0, 0.0, 0.0], [0.0, 3.0, 0.0]])  # image 0 predicts 0 (label 2: wrong), image 1 right
    loader = [(torch.zeros(2, 1), torch.tensor([2, 1]))]
    loss, acc = mean_loss_and_accuracy(FixedLogits(logits), loader, CPU)
    assert acc == 50.0
    assert loss == pytest.approx((60 + math.log(1 + 2 * math.exp(-60)) + math.log(2 + math.exp(3)) - 3) / 2, rel=1e-6)


def test_per_epoch_loss_and_accuracy_with_known_labels_read_the_loader_once():
    logits = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # predicts 0, 0, 1, 0
    labels = torch.tensor([0, 1, 1, 1])                                     # right, wrong, right, wrong
    loader = CountingLoader(torch.zeros(4, 1), labels)
    _, acc = mean_loss_and_accuracy(FixedLogits(logits), loader, CPU, labels=labels)
    assert acc == 50.0
    assert loader.passes == 1


# ----------------------------------------------------------------------------- labels_of


def test_labels_of_a_loader_that_knows_them_takes_them_without_reading_a_batch():
    class Streaming:
        labels = torch.tensor([3, 1, 4])

        def __iter__(self):
            raise AssertionError("labels_of decoded the images to collect labels it was given")

    assert labels_of(Streaming()).tolist() == [3, 1, 4]


def test_labels_of_a_plain_loader_are_its_batches_labels_in_order():
    loader = [(torch.zeros(2, 1), torch.tensor([3, 1])), (torch.zeros(1, 1), torch.tensor([4]))]
    assert labels_of(loader).tolist() == [3, 1, 4]


# ----------------------------------------------------------------------------- cached predictors


def test_cached_log_probs_keep_test_and_validation_log_probs_in_float32():
    test = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    val = torch.tensor([[-2.0, -0.25]], dtype=torch.float64)
    cached = CachedLogProbs(test, val)
    assert cached.predict_log_proba().dtype == torch.float32 and cached.predict_log_proba().tolist() == [[-0.5, -1.0]]
    assert cached.val_log_proba().dtype == torch.float32 and cached.val_log_proba().tolist() == [[-2.0, -0.25]]
    assert CachedLogProbs(test).val_log_proba() is None


def test_an_ensemble_scored_on_the_validation_split_gives_its_members_mean_probability_there():
    val_a, val_b = torch.tensor([[0.9, 0.1]]).log(), torch.tensor([[0.5, 0.5]]).log()
    test = torch.tensor([[0.6, 0.4]]).log()
    built = CachedEnsemble([test, test], [val_a, val_b])
    torch.testing.assert_close(built.val_log_proba().exp(), torch.tensor([[0.7, 0.3]]))
    added = CachedEnsemble()
    added.add(test, val_a)
    added.add(test, val_b)
    torch.testing.assert_close(added.val_log_proba().exp(), torch.tensor([[0.7, 0.3]]))
    torch.testing.assert_close(added.predict_log_proba().exp(), torch.tensor([[0.6, 0.4]]))  # the test split's, too


def test_an_ensemble_knows_nothing_of_the_validation_split_unless_every_member_was_scored_there():
    test, val = torch.tensor([[0.6, 0.4]]).log(), torch.tensor([[0.9, 0.1]]).log()
    partly = CachedEnsemble()
    partly.add(test, val)
    partly.add(test)  # this member was not scored on the validation split
    assert len(partly) == 2 and partly.val_log_proba() is None
    assert CachedEnsemble([test, test]).val_log_proba() is None


def test_an_ensembles_curve_scores_the_first_k_members_for_k_from_one():
    a, b = torch.tensor([[0.9, 0.1]]).log(), torch.tensor([[0.5, 0.5]]).log()
    ensemble = CachedEnsemble([a, b])
    torch.testing.assert_close(ensemble.log_probs(1), a)
    curve = ensemble.curve(torch.tensor([0]))
    assert [row["members"] for row in curve] == [1, 2]
    assert curve[0]["nll"] == pytest.approx(-math.log(0.9), rel=1e-6)  # member a alone
    assert curve[1]["nll"] == pytest.approx(-math.log(0.7), rel=1e-6)  # (0.9 + 0.5) / 2


def test_each_point_of_an_ensembles_curve_is_the_score_of_that_many_first_members_scored_afresh():
    generator = torch.Generator().manual_seed(0)
    members = [(3 * torch.randn(500, 10, generator=generator)).log_softmax(1) for _ in range(6)]
    labels = torch.randint(0, 10, (500,), generator=generator)
    ensemble = CachedEnsemble(members)
    curve = ensemble.curve(labels)
    for k, point in enumerate(curve, start=1):
        assert point == pytest.approx({"members": k, **metrics_from_log_probs(ensemble.log_probs(k), labels)},
                                      rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("combine", [ensemble_log_mean, ensemble_mean])
def test_an_ensemble_with_no_members_refuses_to_score(combine):
    with pytest.raises(ValueError, match="the ensemble has no members yet: nothing to score"):
        combine([])


def test_an_ensemble_of_one_member_is_that_member():
    a = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    assert ensemble_mean([a]).dtype == torch.float32
    torch.testing.assert_close(ensemble_mean([a]), a)


# ----------------------------------------------------------------------------- val_log_probs_of


def test_validation_log_probs_of_a_cached_predictor_are_those_it_kept():
    test = torch.full((4, 3), math.log(1 / 3))                     # 4 test images, 3 classes
    val = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]).log()   # 2 validation images
    labels = torch.tensor([0, 2])
    got = val_log_probs_of(CachedLogProbs(test, val), [(torch.zeros(2, 1), labels)], labels, "swa")
    torch.testing.assert_close(got, val)
    assert val_log_probs_of(CachedLogProbs(test), [(torch.zeros(2, 1), labels)], labels, "swa") is None


def test_validation_log_probs_of_a_network_are_its_prediction_on_the_validation_loader():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    labels = torch.tensor([0, 2])
    got = val_log_probs_of(ModelPredictor(FixedLogits(logits), CPU), [(torch.zeros(2, 1), labels)], labels, "sgd")
    torch.testing.assert_close(got, logits.log_softmax(dim=1))


def test_a_predictor_that_answers_with_the_test_sets_rows_is_refused_naming_it_and_the_remedy():
    class TestSetOnly:
        def predict_log_proba(self, loader):
            return torch.zeros(4, 3)  # computed once on 4 test images, whatever the loader

    labels = torch.tensor([0, 2])
    with pytest.raises(RuntimeError) as refused:
        val_log_probs_of(TestSetOnly(), [(torch.zeros(2, 1), labels)], labels, "fge")
    message = str(refused.value)
    assert "predictor 'fge' gave 4 rows for the 2 validation images" in message
    assert "the validation split through val_log_proba() (swalab.evaluate.CachedLogProbs takes both)" in message


# ----------------------------------------------------------------------------- reliability bins, ECE, top-5


# three classes, five images: confidence (the max), predicted class (argmax) and whether it is right
PROBS = torch.tensor([[0.6, 0.3, 0.1],     # conf 0.6, predicts 0, label 0: right
                      [0.7, 0.2, 0.1],     # conf 0.7, predicts 0, label 1: wrong
                      [0.05, 0.9, 0.05],   # conf 0.9, predicts 1, label 1: right
                      [1.0, 0.0, 0.0],     # conf 1.0, predicts 0, label 0: right (a certain prediction)
                      [0.5, 0.3, 0.2]])    # conf 0.5, predicts 0, label 0: right (on a bin edge)
LABELS = torch.tensor([0, 1, 1, 0, 0])


def test_reliability_bins_are_equal_width_right_closed_and_empty_bins_say_none():
    rows = reliability_bins(PROBS, LABELS, bins=4)
    assert [(r["lo"], r["hi"]) for r in rows] == [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]
    assert [r["count"] for r in rows] == [0, 1, 2, 2]  # 0.5 in (0.25, 0.5]; 0.6, 0.7; 0.9, 1.0 in (0.75, 1]
    assert [r["acc"] for r in rows] == [None, 1.0, 0.5, 1.0]
    assert rows[0]["conf"] is None
    assert [r["conf"] for r in rows[1:]] == pytest.approx([0.5, 0.65, 0.95])


def test_ece_uses_the_number_of_bins_it_is_given():
    # 4 bins: 1/5 |1 - 0.5| + 2/5 |0.5 - 0.65| + 2/5 |1 - 0.95| = 0.1 + 0.06 + 0.02
    assert expected_calibration_error(PROBS, LABELS, bins=4) == pytest.approx(0.18, rel=1e-5)


def test_ece_of_no_predictions_is_zero():
    assert expected_calibration_error(torch.empty(0, 3), torch.empty(0, dtype=torch.long)) == 0.0


def test_top5_accuracy_is_reported_only_with_more_than_five_classes():
    probs = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]])
    assert set(metrics_from_probs(probs, torch.tensor([4]))) == {"acc", "nll", "ece", "ece_mass20", "brier"}


# ----------------------------------------------------------------------------- the metrics table


def test_the_metrics_table_prints_one_aligned_line_per_scored_predictor():
    table = metrics_table({"sgd": {"acc": 93.456, "nll": 0.21234, "ece": 0.01234, "brier": 0.1},
                           "swa": {"acc": 92.0, "nll": 0.25, "ece": 0.02},  # an earlier file: no Brier score
                           "fge_curve": {"members": 3}})                    # no accuracy: not a table row
    assert table.split("\n") == [
        "predictor       acc %      nll      ece    brier",
        "sgd             93.46   0.2123   0.0123   0.1000",
        "swa             92.00   0.2500   0.0200        –",
        "ece: 15 equal-width confidence bins (Guo et al. 2017)",
    ]


def test_the_metrics_tables_first_column_widens_to_the_longest_name():
    table = metrics_table({"swa_budget_1.25": {"acc": 50.0, "nll": 1.0, "ece": 0.5, "brier": 0.25}})
    assert table.split("\n") == [
        "predictor          acc %      nll      ece    brier",
        "swa_budget_1.25    50.00   1.0000   0.5000   0.2500",
        "ece: 15 equal-width confidence bins (Guo et al. 2017)",
    ]


# ----------------------------------------------------------------------------- fidelity: top-5 and ECE binnings


def underflowing_row(label: int, rank: int, classes: int = 100) -> torch.Tensor:
    """Log-probabilities of one image: class 0 sure (log p = 0), the ``label`` ranked ``rank`` (1 = first), every other
    class below log p = -200, where a float32 probability is 0 (the floor is about -103)."""
    row = -300.0 - torch.arange(classes, dtype=torch.float32)  # distinct, all below the label's
    row[0] = 0.0
    others = [c for c in range(1, classes) if c != label][: rank - 2]
    for i, c in enumerate(others):
        row[c] = -200.0 - i
    row[label] = -200.0 - (rank - 2) - 0.5
    return row


def test_top5_ranks_on_log_probabilities_where_float32_probabilities_underflow_to_zero():
    """Below log p ~ -103 a float32 probability is 0 and every such class ties: a label ranked 2nd must still be a hit,
    one ranked 6th a miss, whatever order the ties would have come in."""
    labels = [7, 19, 33, 48, 52, 66, 71, 85, 93, 99]
    log_probs = torch.stack([*(underflowing_row(c, rank=2) for c in labels), *(underflowing_row(c, rank=6) for c in labels)])
    assert (log_probs.exp()[:, 1:] == 0).all()  # the case: every class but the first underflows
    assert (log_probs.argsort(dim=1, descending=True)[:10, 1] == torch.tensor(labels)).all()  # ranked 2nd
    m = metrics_from_log_probs(log_probs, torch.tensor(labels * 2))
    assert m["top5"] == pytest.approx(50.0)  # the ten labels ranked 2nd, none of the ten ranked 6th


def test_equal_mass_ece_splits_the_images_sorted_by_confidence_into_bins_of_equal_count():
    from swalab.evaluate import equal_mass_calibration_error

    # confidences 0.5 (right), 0.6 (wrong), 0.7 (wrong), 0.9 (right): two bins of two images each
    probs = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.1, 0.9], [0.3, 0.7]])
    labels = torch.tensor([1, 0, 1, 0])
    low = abs(0.5 * (1 + 0) - 0.5 * (0.5 + 0.6))   # bin of 0.5 and 0.6
    high = abs(0.5 * (0 + 1) - 0.5 * (0.7 + 0.9))  # bin of 0.7 and 0.9
    assert equal_mass_calibration_error(probs, labels, bins=2) == pytest.approx(0.5 * low + 0.5 * high, rel=1e-5)


def test_every_predictor_is_scored_with_the_swag_papers_twenty_equal_mass_bins_beside_the_fifteen_equal_width_ones():
    from swalab.evaluate import equal_mass_calibration_error

    log_probs = torch.randn(60, 4, generator=torch.Generator().manual_seed(0)).log_softmax(1)
    labels = torch.randint(0, 4, (60,), generator=torch.Generator().manual_seed(1))
    m = metrics_from_log_probs(log_probs, labels)
    assert m["ece_mass20"] == pytest.approx(equal_mass_calibration_error(log_probs.exp(), labels, bins=20))
    assert m["ece"] == pytest.approx(expected_calibration_error(log_probs.exp(), labels, bins=15))
    assert m["ece_mass20"] != m["ece"]


def test_equal_mass_ece_with_fewer_images_than_bins_puts_one_image_in_each_bin():
    from swalab.evaluate import equal_mass_calibration_error

    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    # each image its own bin: |1 - 0.8| / 2 + |0 - 0.6| / 2
    assert equal_mass_calibration_error(probs, torch.tensor([0, 0]), bins=20) == pytest.approx(0.4, rel=1e-5)
    assert equal_mass_calibration_error(torch.empty(0, 2), torch.empty(0, dtype=torch.long)) == 0.0


def test_the_metrics_table_says_which_binning_each_ece_column_uses():
    table = metrics_table({"sgd": {"acc": 93.0, "nll": 0.2, "ece": 0.01, "ece_mass20": 0.02, "brier": 0.1}})
    assert "ece: 15 equal-width confidence bins (Guo et al. 2017)" in table
    assert "ece_mass20: 20 equal-mass bins (the SWAG paper's)" in table
    assert table.split("\n")[1].split() == ["sgd", "93.00", "0.2000", "0.0100", "0.0200", "0.1000"]
