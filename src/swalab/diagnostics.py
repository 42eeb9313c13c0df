"""How different two predictors' outputs are: the paper's section 3.5 diagnostics.

Section 3.5 compares the FGE ensemble with the SWA model (the average of the FGE proposals'
weights) on the test set of PreResNet-164 / CIFAR-100 with two numbers per pair of predictors:

* the mean over test examples of the L2 norm of the difference of the class-probability vectors
  (0.126 between consecutive FGE proposals, 0.079 between the SWA model and the FGE ensemble);
* the label agreement, the percentage of test examples on which both predict the same class
  (at most 87.33% between consecutive proposals, 95.26% between SWA and FGE).

Small distances and high agreement between SWA and the ensemble are the paper's evidence that
averaging weights approximates averaging predictions. Everything here is a pure function of
probability tensors ``[N, C]``, so it applies to cached FGE members as well as to live models.
"""

from __future__ import annotations

from typing import Sequence

import torch

from swalab.evaluate import ensemble_mean


def _check_pair(p: torch.Tensor, q: torch.Tensor) -> None:
    if p.dim() != 2 or p.shape != q.shape:
        raise ValueError(f"expected two probability tensors of the same shape [N, C], got {tuple(p.shape)} "
                         f"and {tuple(q.shape)}")


def mean_prob_l2(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over examples of ``||p_i - q_i||_2``, the L2 norm of the class-probability difference."""
    _check_pair(p, q)
    return float((p.double() - q.double()).norm(dim=1).mean())


def label_agreement(p: torch.Tensor, q: torch.Tensor) -> float:
    """Percentage of examples on which ``p`` and ``q`` predict the same class (argmax)."""
    _check_pair(p, q)
    return 100.0 * float(p.argmax(dim=1).eq(q.argmax(dim=1)).double().mean())


def pair_diagnostics(p: torch.Tensor, q: torch.Tensor) -> dict[str, float]:
    """``{"l2": mean L2 distance, "agreement": label agreement in %}`` of one pair of predictors."""
    return {"l2": mean_prob_l2(p, q), "agreement": label_agreement(p, q)}


def consecutive_members(member_probs: Sequence[torch.Tensor]) -> dict:
    """Diagnostics of every consecutive pair of ensemble members (k, k + 1), plus a summary.

    ``mean_l2`` averages the pairs' distances (the paper's 0.126); ``max_agreement`` is the highest
    agreement of any pair (the paper: "not greater than 87.33%"), ``mean_agreement`` their mean.
    """
    if len(member_probs) < 2:
        raise ValueError(f"consecutive-member diagnostics need at least 2 members, got {len(member_probs)}")
    pairs = [{"members": [k + 1, k + 2], **pair_diagnostics(a, b)}
             for k, (a, b) in enumerate(zip(member_probs[:-1], member_probs[1:]))]
    return {"pairs": pairs,
            "mean_l2": sum(r["l2"] for r in pairs) / len(pairs),
            "mean_agreement": sum(r["agreement"] for r in pairs) / len(pairs),
            "max_agreement": max(r["agreement"] for r in pairs)}


def section35(member_probs: Sequence[torch.Tensor], single: dict[str, torch.Tensor]) -> dict:
    """All section 3.5 numbers for one FGE run and any single models to hold against its ensemble.

    ``single`` maps a name (``"swa"``, ``"fge_avg"`` ...) to that model's test probabilities.
    Returns ``{"consecutive": consecutive_members(...) or None, "vs_ensemble": {name: pair}}``.
    """
    ens = ensemble_mean(member_probs)
    return {"members": len(member_probs),
            "consecutive": consecutive_members(member_probs) if len(member_probs) >= 2 else None,
            "vs_ensemble": {name: pair_diagnostics(p, ens) for name, p in single.items()}}
