"""How different two predictors' outputs are: the paper's section 3.5 diagnostics.

Section 3.5 compares the FGE ensemble with the SWA model (the average of the FGE proposals'
weights) on the test set of PreResNet-164 / CIFAR-100 with two numbers per pair of predictors:

* the mean over test examples of the L2 norm of the difference of the class-probability vectors
  (0.126 between consecutive FGE proposals, 0.079 between the SWA model and the FGE ensemble);
* the label agreement, the percentage of test examples on which both predict the same class
  (at most 87.33% between consecutive proposals, 95.26% between SWA and FGE).

Small distances and high agreement between SWA and the ensemble are the paper's evidence that
averaging weights approximates averaging predictions. Everything here is a pure function of
probability tensors ``[N, C]``, so it applies to cached FGE members as well as to live models."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch

from swalab.evaluate import ensemble_mean

if TYPE_CHECKING:  # the table imports this module's section35_of through the report's writers
    from swalab.results.table import Row


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
    agreement of any pair (the paper: "not greater than 87.33%"), ``mean_agreement`` their mean."""
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
    Returns ``{"consecutive": consecutive_members(...) or None, "vs_ensemble": {name: pair}}``."""
    ens = ensemble_mean(member_probs)
    return {"members": len(member_probs),
            "consecutive": consecutive_members(member_probs) if len(member_probs) >= 2 else None,
            "vs_ensemble": {name: pair_diagnostics(p, ens) for name, p in single.items()}}


# -- from the files runs saved ----------------------------------------------------------------------

def _load_probs(path: Path) -> dict | None:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None


def same_budget(column, fge_column) -> bool:
    """Whether ``column`` was trained at the budget B of ``fge_column`` (SWA 1.5B (6 ep) and FGE 1B (4 ep): B = 4),
    by the rule that made its epochs (``swalab.config.budget_epochs``), as the paired table pairs with SGD."""
    from swalab.config import epochs_of_budget

    return bool(fge_column.budget) and epochs_of_budget(column.budget, fge_column.epochs / fge_column.budget) == column.epochs


def section35_of(row: Row, kin: Sequence[Row] = ()) -> dict[str, dict]:
    """Per FGE column of ``row``: the paper's section 3.5 numbers for each seed that has both an FGE run
    (``fge_member_probs.pt``) and SWA runs (``predictions.pt``), scored on the same test labels. The SWA runs are
    ``row``'s and those of ``kin``, rows that share every setting with it but SWA's own (named by their label), at
    the FGE column's budget B (:func:`same_budget`): a SWA run trained at another B is named under ``other_budget``
    with its B, never set against the ensemble (its distance would measure the length, not the basin).

    ``{fge column label: {"consecutive_l2": [...], "max_agreement": [...], "vs": {swa column label:
    {"l2": [...], "agreement": [...]}}, "other_budget": {swa column label: B in epochs}, "budget": B}}``, one value
    per seed."""
    from swalab.methods.fge import MEMBER_PROBS_FILE, member_log_probs_of
    from swalab.rundir import RunDir

    out: dict[str, dict] = {}
    every_swa = [(c, cell, f"{c.label} · {r.label}" if r is not row else c.label) for r in (row, *kin)
                 for c, cell in sorted(r.cells.items(), key=lambda kv: kv[0].order) if c.method == "swa"]
    for fge_column, fge_cell in row.cells.items():
        if fge_column.method != "fge":
            continue
        swa = [s for s in every_swa if same_budget(s[0], fge_column)]
        block = {"consecutive_l2": [], "max_agreement": [], "vs": defaultdict(lambda: {"l2": [], "agreement": []}),
                 "seeds": [], "budget": fge_column.epochs / fge_column.budget if fge_column.budget else None,
                 "other_budget": {label: c.epochs / c.budget for c, _, label in every_swa
                                  if not same_budget(c, fge_column) and c.budget}}
        for entry in fge_cell.entries:
            path = entry.run.path / MEMBER_PROBS_FILE
            members = _load_probs(path)
            member_probs = [p.exp() for p in member_log_probs_of(members, path)] if members else []
            if not member_probs:
                continue
            singles = {}
            for swa_column, swa_cell, swa_label in swa:
                twin = next((e for e in swa_cell.entries if e.run.seed == entry.run.seed), None)
                saved = _load_probs(twin.run.path / RunDir.PREDICTIONS) if twin else None
                if saved and twin.predictor in saved["probs"] and saved["labels"].equal(members["labels"]):
                    singles[swa_label] = saved["probs"][twin.predictor].float()
            result = section35(member_probs, singles)
            block["seeds"].append(entry.run.seed)
            if result["consecutive"] is not None:
                block["consecutive_l2"].append(result["consecutive"]["mean_l2"])
                block["max_agreement"].append(result["consecutive"]["max_agreement"])
            for label, pair in result["vs_ensemble"].items():
                block["vs"][label]["l2"].append(pair["l2"])
                block["vs"][label]["agreement"].append(pair["agreement"])
        if block["seeds"]:
            block["vs"] = dict(block["vs"])
            out[fge_column.label] = block
    return out
