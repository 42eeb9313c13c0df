"""The small files of a run directory and the one-line errors they record.

``git.json``, ``status.json`` (best effort: a full disk must not hide the error it reports),
``predictions.pt``, and the ``<type>: <first line>`` form of an error that ``status.json`` and a grid's
summary keep. Only the main rank writes (data-parallel runs share one directory).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import torch

from swalab import distributed
from swalab.checkpoint import atomic_save
from swalab.logs import get_logger

log = get_logger()
PREDICTIONS_FILE = "predictions.pt"
PREDICTIONS_MAX = 5_000_000  # numbers per predictor (test images x classes) kept in predictions.pt


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def git_info() -> dict:
    root = Path(__file__).resolve().parents[3]  # the repository (src/swalab/train/records.py)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {"commit": commit or None, "dirty": dirty}


def write_json(path: Path, obj) -> None:
    if not distributed.is_main():  # data-parallel runs: rank 0 writes the run directory
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=float) + "\n")
    tmp.replace(path)


def message(exc: BaseException) -> str:
    """What an error says, without Python's ``[Errno N]`` prefix on the OS errors swalab words itself."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        return str(exc.strerror).strip()
    return str(exc).strip()


def one_line(exc: BaseException) -> str:
    """``<type>: <first line of its message>``: what status.json and a grid's summary record. A first line
    that introduces a list (``invalid config:`` then ``  - seed='abc' must be an integer``) keeps the list's
    items, joined by ``;``, so the line still names the key to fix."""
    text = [line.strip() for line in message(exc).splitlines() if line.strip()]
    first = text[0] if text else ""
    if first.endswith(":") and len(text) > 1:
        first += " " + "; ".join(line.removeprefix("- ") for line in text[1:] if line.startswith("- "))
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def write_status(run_dir: Path, status: dict) -> None:
    """``status.json``, best effort: when the disk is full even this small file may not fit, and the
    error being reported matters more than the record of it."""
    try:
        write_json(run_dir / "status.json", status)
    except OSError as exc:
        log.warning(f"[swalab] could not record status {status.get('status')!r} in {run_dir} ({exc})")


def save_predictions(evaluation, path: Path) -> None:
    """Each predictor's test probabilities (float16) and the labels, for analyses that need no weights
    (the report's section 3.5 diagnostics). Left out above ``PREDICTIONS_MAX`` numbers per predictor
    (ImageNet's 50,000 x 1,000 would be 100 MB a predictor)."""
    kept = {name: p.half() for name, p in evaluation.probs.items() if p.numel() <= PREDICTIONS_MAX}
    if kept:
        atomic_save({"probs": kept, "labels": evaluation.labels}, path)
