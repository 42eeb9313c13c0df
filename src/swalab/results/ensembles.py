"""Ensembles of seeds from saved predictions: deep ensembles (``SGD x3``) and MultiSWAG (``SWAG x3``).

When to use it: a report over several seeds of one config already holds what a deep ensemble (Lakshminarayanan et
al. 2017) of those seeds predicts, and, for SWAG, MultiSWAG (Wilson & Izmailov 2020: SWAG from independent seeds,
predictions averaged over every sample of every seed): each run kept its test log-probabilities in
``predictions.pt``. The ensemble of a cell (one config, its seeds: ``swalab.results.table``) is the mean of its
seeds' probabilities, scored by ``swalab.evaluate.metrics_from_log_probs`` like every other predictor, with no
forward pass. Each SWAG seed's prediction is already the mean over its S samples, so ``SWAG x3`` is the mean over
all 3 S samples, weighted alike.

What is never ensembled: runs of other configs (a cell holds one identity minus the seed), runs scored on other test
images (the seeds' labels must be equal), a cell of one seed, and the ``+ts`` columns: a temperature for an ensemble
of seeds would have to be fitted on the ensemble's own validation log-probabilities, which runs do not keep.
An ensemble that cannot be formed says why. The log-probabilities are stored as float16 (about 3 significant digits
each, a small probability kept as such rather than rounded to 0); the ensemble's metrics come from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from swalab.evaluate import ensemble_log_mean, metrics_from_log_probs, reported_metrics
from swalab.results.table import POSTHOC_ENTRY, Cell, Column, Row, Table
from swalab.rundir import RunDir, earlier_format


@dataclass
class SeedEnsemble:
    """The ensemble of one cell's seeds: its metrics, or why it could not be formed."""

    row: Row
    column: Column
    seeds: list
    metrics: dict | None = None
    why: str | None = None
    members: dict = field(default_factory=dict)  # per metric, the seeds' own values (the cell's)

    @property
    def label(self) -> str:
        """``SWAG 1.5B (45 ep) x3``."""
        return f"{self.column.label} x{len(self.seeds)}"


def _read(path: Path) -> dict | None:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001  a damaged file is said, not raised
        return None


def saved_log_probs(run_path: Path, predictor: str, files: dict | None = None,
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None, str | None]:
    """``(log-probabilities, labels, None)`` of ``predictor`` in a run's ``predictions.pt``, or ``(None, None, why)``.
    ``files`` keeps the files read so far (one read per run)."""
    path = Path(run_path) / RunDir.PREDICTIONS
    if not path.exists():
        return None, None, (f"{path.parent.name} has no {RunDir.PREDICTIONS} (written by an earlier "
                                 "swalab, or left behind when the run was copied)")
    files = {} if files is None else files
    if path not in files:
        files[path] = _read(path)
    saved = files[path]
    if not isinstance(saved, dict) or "labels" not in saved:
        return None, None, f"{path} cannot be read"
    if predictor in (saved.get("log_probs") or {}):
        return saved["log_probs"][predictor].float(), saved["labels"], None
    if "log_probs" not in saved:  # an earlier swalab's file, of probabilities only
        return None, None, earlier_format(str(path), path.parent)
    return None, None, f"{path} holds no predictions of {predictor!r} (above {RunDir.PREDICTIONS}'s limit of numbers)"


def saved_where(entry) -> tuple[Path, str]:
    """The folder whose ``predictions.pt`` holds ``entry``'s test predictions, and its name there: the run's own, or
    for an average built after training (``posthoc:<label>``) its folder under the run's ``posthoc/``."""
    label = entry.predictor.removeprefix(POSTHOC_ENTRY)
    if label != entry.predictor and label in entry.run.posthoc_folders:
        return entry.run.posthoc_folders[label], label
    return Path(entry.run.path), entry.predictor


def ensemble_of(row: Row, column: Column, cell: Cell, files: dict | None = None) -> SeedEnsemble:
    """The ensemble of ``cell``'s seeds (module doc), or why there is none."""
    out = SeedEnsemble(row=row, column=column, seeds=cell.seeds,
                       members={m.name: cell.values(m.name) for m in reported_metrics()})
    if len(cell.entries) < 2:
        out.why = "one seed: an ensemble of seeds needs 2 or more"
        return out
    members, labels = [], None
    for entry in cell.entries:
        log_probs, own_labels, why = saved_log_probs(*saved_where(entry), files)
        if why is not None:
            out.why = f"seed {entry.run.seed}: {why}"
            return out
        if labels is None:
            labels = own_labels
        elif own_labels.shape != labels.shape or not torch.equal(own_labels, labels):
            out.why = (f"seed {entry.run.seed} was scored on other test labels than seed {cell.entries[0].run.seed}: "
                       "not the same test set")
            return out
        members.append(log_probs)
    out.metrics = metrics_from_log_probs(ensemble_log_mean(members), labels)
    return out


def seed_ensembles(table: Table) -> list[SeedEnsemble]:
    """The ensemble of every cell's seeds, row by row in the table's column order; the ``+ts`` columns are left out
    (module doc)."""
    files: dict = {}
    return [ensemble_of(row, column, row.cells[column], files) for row in table.rows
            for column in sorted(row.cells, key=lambda c: c.order) if not column.scaled]
