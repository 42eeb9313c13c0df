"""Score a point of weight space, and keep the scores of many points in a resumable log.

:class:`Probe` turns a parameter vector into the numbers the paper plots: the L2-regularised
train loss (mean cross-entropy + wd/2 ||w||^2, ``train_loss``), the plain train cross-entropy and
error, and the test loss and error (errors in %). With ``bn_update`` it first recomputes the
BatchNorm statistics for those weights over the training subset (``torch.optim.swa_utils.update_bn``,
the pass the trainer makes for SWA); without it the reference state's buffers are used as they are.

:class:`ResultLog` is a JSON-lines file with one line per evaluated point, flushed as soon as the
point is done. A killed analysis re-run with the same ``--out`` skips every point already there, so
long CPU grids can be stopped and resumed; the header line stores the settings and a second run
with other settings is refused rather than mixing two surfaces in one file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from swalab.config import ConfigError
from swalab.evaluate import predict_logits, recompute_bn
from swalab.rundir import atomic_write
from swalab.analysis.weights import ParamSpace, squared_norm


class Probe:
    """Metrics of ``model`` at any parameter vector of ``space`` (see the module docstring)."""

    def __init__(self, model: nn.Module, space: ParamSpace, buffers: dict[str, torch.Tensor], data,
                 device: torch.device, weight_decay: float, bn_update: bool):
        self.model, self.space, self.buffers, self.data = model.to(device), space, buffers, data
        self.device, self.weight_decay, self.bn_update = device, float(weight_decay), bool(bn_update)
        self.calls = 0

    def load(self, vector: torch.Tensor, buffers: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """Put ``vector`` and buffers (default: the reference ones) into the model; recompute BN if asked."""
        self.model.load_state_dict(self.space.to_state(vector, self.buffers if buffers is None else buffers))
        if self.bn_update:  # the same (epoch-0) augmented pass for every point
            recompute_bn(self.model, self.data.bn, self.device)
        return self.model

    def _loss_and_error(self, loader) -> tuple[float, float]:
        logits = predict_logits(self.model, loader, self.device)
        labels = torch.cat([y.cpu() for _, y in loader])
        loss = float(F.cross_entropy(logits, labels))
        error = 100.0 * float(logits.argmax(1).ne(labels).float().mean())
        return loss, error

    def __call__(self, vector: torch.Tensor, buffers: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        self.calls += 1
        self.load(vector, buffers)
        train_ce, train_err = self._loss_and_error(self.data.train_eval)
        test_loss, test_err = self._loss_and_error(self.data.test)
        l2 = 0.5 * self.weight_decay * squared_norm(vector)
        return {"train_loss": train_ce + l2, "train_ce": train_ce, "train_err": train_err,
                "test_loss": test_loss, "test_err": test_err}


def save_arrays(path: str | Path, **arrays) -> Path:
    """An analysis' arrays as ``.npz`` (``np.savez``), written atomically: an analysis run again into the same
    ``--out`` and stopped while it writes keeps the arrays of the earlier one, whole."""
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def _read_lines(path: Path) -> list[dict]:
    """The JSON lines of ``path``. A last line cut short (the process killed while it wrote that point) is dropped
    from the file, so that the point is evaluated again; a damaged line before it is refused."""
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n < len(lines):
                raise ConfigError(f"{path} line {n} is damaged: use another --out directory, or delete the file "
                                  "to start afresh") from None
    if len(rows) < len(lines) or not text.endswith("\n"):
        atomic_write(path, lambda f: f.write("".join(json.dumps(row) + "\n" for row in rows).encode()))
    return rows


def same_setting(a, b) -> bool:
    """Whether two settings of a result log are the same, floats to 1e-9 relative: the plane's extent is computed
    from the weights, and the same command at another thread count sums them in another order (a few 1e-16 apart),
    which must not make its own log read as another analysis's."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_setting(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_setting(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9,
                                                                                            abs_tol=1e-12)
    return a == b


class ResultLog:
    """Append-only JSON lines: a header ``{"settings": ...}``, then one ``{"key": ..., ...}`` per point."""

    def __init__(self, path: str | Path, settings: dict):
        self.path = Path(path)
        self.rows: dict[str, dict] = {}
        settings = json.loads(json.dumps(settings))  # normalise tuples, numpy scalars
        if self.path.exists() and self.path.stat().st_size:
            lines = _read_lines(self.path)
            stored = lines[0].get("settings") if lines else None
            if not same_setting(stored, settings):
                differ = "; ".join(f"{k}: {(stored or {}).get(k)!r} there, {settings.get(k)!r} now"
                                   for k in sorted(set(stored or {}) | set(settings))
                                   if not same_setting((stored or {}).get(k), settings.get(k)))
                raise ConfigError(f"{self.path} holds results for other settings ({differ}): use another --out "
                                  "directory, or delete the file to start afresh")
            self.rows = {row["key"]: row for row in lines[1:] if "key" in row}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write({"settings": settings})

    def _write(self, obj: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def add(self, key: str, row: dict) -> None:
        row = {"key": key, **row}
        self._write(row)
        self.rows[key] = row
