"""The section 3.5 diagnostics on hand-made probabilities, where every number can be worked out."""

from __future__ import annotations

import math

import pytest
import torch

from swalab.results.diagnostics import (
    consecutive_members,
    ensemble_mean,
    label_agreement,
    mean_prob_l2,
    pair_diagnostics,
    section35,
)

P = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [0.0, 0.1, 0.9]])
Q = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [0.0, 0.9, 0.1]])


def test_mean_prob_l2_is_the_mean_of_per_example_euclidean_norms():
    # rows differ by (1, -1, 0), 0, 0, (0, -0.8, 0.8): norms sqrt(2), 0, 0, 0.8*sqrt(2)
    assert mean_prob_l2(P, Q) == pytest.approx((math.sqrt(2) + 0.8 * math.sqrt(2)) / 4)
    assert mean_prob_l2(P, P) == 0.0
    assert mean_prob_l2(P, Q) == pytest.approx(mean_prob_l2(Q, P))


def test_label_agreement_counts_equal_argmax_in_percent():
    assert label_agreement(P, Q) == pytest.approx(50.0)  # rows 2 and 3 agree (row 2 ties: argmax 0 in both)
    assert label_agreement(P, P) == 100.0
    assert pair_diagnostics(P, Q) == {"l2": pytest.approx(mean_prob_l2(P, Q)), "agreement": pytest.approx(50.0)}


def test_shapes_must_match():
    with pytest.raises(ValueError, match="same shape"):
        mean_prob_l2(P, Q[:2])


def test_consecutive_members_pairs_each_member_with_the_next():
    R = torch.tensor([[0.0, 1.0, 0.0]] * 4)
    out = consecutive_members([P, Q, R])
    assert [p["members"] for p in out["pairs"]] == [[1, 2], [2, 3]]
    assert out["pairs"][1]["agreement"] == pytest.approx(50.0)  # Q vs R: rows 1 and 4
    assert out["mean_l2"] == pytest.approx((mean_prob_l2(P, Q) + mean_prob_l2(Q, R)) / 2)
    assert out["max_agreement"] == pytest.approx(50.0)
    with pytest.raises(ValueError, match="at least 2"):
        consecutive_members([P])


def test_ensemble_is_the_mean_and_section35_compares_singles_with_it():
    torch.testing.assert_close(ensemble_mean([P, Q]), (P + Q) / 2)
    out = section35([P, Q], {"swa": (P + Q) / 2, "first": P})
    assert out["members"] == 2
    assert out["vs_ensemble"]["swa"] == {"l2": pytest.approx(0.0), "agreement": pytest.approx(100.0)}
    assert out["vs_ensemble"]["first"]["l2"] == pytest.approx(mean_prob_l2(P, (P + Q) / 2))
    assert section35([P], {})["consecutive"] is None
