"""The small files of a run directory and the one-line errors they record.

``metrics.json`` (the record that a run is finished, :func:`final_metrics`), ``git.json``, ``status.json`` (best effort: a full disk must not hide the error it reports),
``predictions.pt``, and the ``<type>: <first line>`` form of an error that ``status.json`` and a grid's
summary keep. Only the main rank writes (data-parallel runs share one directory).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np
import torch

from swalab import distributed
from swalab.cli import message
from swalab.checkpoint import atomic_save
from swalab.data.splits import pixel_max
from swalab.logs import get_logger
from swalab.precision import training_dtype

log = get_logger()
PREDICTIONS_FILE = "predictions.pt"
METRICS_FILE = "metrics.json"
# Every name a run writes in its directory (swalab.train's module doc; FGE's fge_member_probs.pt and members/ too): a
# folder that holds one of them but no record of a run (swalab.train.plan.run_record) is no run, and training there
# would write over a file of the user's. The lock (swalab.runlock) is not among them: it is taken before a run is known.
RUN_FILES = ("config.yaml", "overrides.yaml", "identity.json", "git.json", "environment.json", "data.json",
             "lineage.json", "status.json", "run.log", "history.jsonl", METRICS_FILE, "final.pt", "reliability.json",
             PREDICTIONS_FILE, "wandb_run.json", "wandb", "checkpoints", "members", "fge_member_probs.pt")
PREDICTIONS_MAX = 5_000_000  # numbers per predictor (test images x classes) kept in predictions.pt


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python's, numpy's and torch's generators (every device's) for ``rank`` (:func:`rank_seed`)."""
    seed = rank_seed(seed, rank)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s generators: ``seed`` itself for rank 0 (so one process and rank 0 of many draw alike),
    for rank k a seed mixed from ``(seed, k)`` with numpy's ``SeedSequence``. Each rank thus draws its own dropout
    masks and Shake-Shake coefficients (the same for all ranks would correlate the noise of the ranks' slices of
    the batch); the model's initial weights are rank 0's on every rank (DDP broadcasts them), and the data order
    comes from its own ``(seed, epoch)`` generator, never from these."""
    if rank == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(rank)]).generate_state(1, dtype=np.uint64)[0] >> 1)


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


ENVIRONMENT_FILE = "environment.json"


def environment_entry(device, git: dict, precision: str = "auto") -> dict:
    """What a run's numbers depend on beyond its config, as this process runs it: when it started, the commit
    (``git``, from :func:`git_info`), torch's version, its CPU thread count and the device (on CUDA with the GPU's
    name), and the autocast its training steps run in (``training_autocast``: what ``trainer.precision``, e.g.
    ``auto``, resolved to on this device). The thread count matters on a CPU:
    it changes the order of float sums, so a run is reproduced bit for bit only at the same count
    (docs/cluster.md); a run resumed at another count says so in its second entry."""
    device = torch.device(device)
    dtype = training_dtype(device, precision)
    entry = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), **git, "torch": torch.__version__,
             "threads": torch.get_num_threads(), "device": str(device),
             "training_autocast": "float32 (none)" if dtype is None else str(dtype).removeprefix("torch.")}
    if device.type == "cuda":
        entry["device_name"] = torch.cuda.get_device_name(device)
    return entry


def append_environment(run_dir: str | Path, entry: dict) -> None:
    """Add ``entry`` to the run's ``environment.json``, one entry per time the run started or resumed."""
    path = Path(run_dir) / ENVIRONMENT_FILE
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = []
    write_json(path, [*(entries if isinstance(entries, list) else []), entry])


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Have ``write`` fill a temp file beside ``path`` (it is handed the open binary file), then rename it over
    ``path``. For any file a reader may open while it is rewritten (a record, a summary, a figure, an array): a
    kill leaves the old file or the new one, never half of one; an error while writing leaves the old file and
    no temp file behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; these are shared like any other output
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# The temp name atomic_write and atomic_save give a file while they write it (tempfile.mkstemp's 8 random characters).
KILLED_WRITE = re.compile(r"^[\w@+-][\w.@+-]*\.[a-z0-9_]{8}\.tmp$")
WRITTEN_IN = ("", "members", "checkpoints", "checkpoints/predictions", "checkpoints/saved")  # the run's folders


def remove_killed_writes(run_dir: str | Path) -> list[Path]:
    """Remove the temp files (``status.json.<random>.tmp``) that a run killed mid-write (``kill -9``, an out-of-memory
    kill) left in ``run_dir`` and its folders, and return them. Only swalab's own temp names; call it only while
    holding the run's lock (``swalab.runlock``), so that no live process is writing one of them."""
    removed = []
    for folder in WRITTEN_IN:
        where = Path(run_dir) / folder
        if not where.is_dir():
            continue
        for path in where.iterdir():
            if KILLED_WRITE.match(path.name) and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def make_durable(run_dir: str | Path, names: tuple[str, ...]) -> None:
    """Flush each of ``names`` (those that exist) in ``run_dir`` and the directory itself to disk (``fsync``).

    When: before a finished run deletes the checkpoints a resume would read (``CheckpointStore.release_resume_state``):
    the renames that put its final records in place must survive a power cut first, or the run could be left with
    neither its records nor a checkpoint to score it again from."""
    run_dir = Path(run_dir)
    for path in [run_dir / name for name in names if (run_dir / name).is_file()] + [run_dir]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`). Only the main rank writes (data-parallel runs
    share one directory)."""
    if not distributed.is_main():
        return
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=float) + "\n")


DATA_FILE = "data.json"


def data_facts(data, record: dict | None) -> dict:
    """What a run found in its data set (``data.json``): the record of the files read (per class folder a count
    and a hash, ``swalab.data.fingerprint``), the classes, channels, image size, bits per pixel and channel (8, or
    16 for 16-bit grey images), split sizes, the normalisation measured on the training images (when the loader measures it) and the decode cache; with a
    validation split (``dataset.val_size``), how many images it holds (``val_images``, never among ``train_images``)."""
    images = getattr(data.train, "images", None)
    val = getattr(data, "val", None)
    return {"name": data.name, "num_classes": int(data.num_classes), "classes": list(data.classes),
            "channels": getattr(data, "channels", None),
            "image_size": list(images.shape[-2:]) if images is not None else None,
            "bits_per_pixel": pixel_max(images).bit_length() if images is not None else 8,  # 255: 8, 65535: 16
            "train_images": len(data.train), "test_images": len(data.test),
            **({"val_images": len(val)} if val is not None else {}),
            "measured_mean": getattr(data, "mean", None), "measured_std": getattr(data, "std", None),
            "record": record}


def read_data_record(run_dir: str | Path) -> dict | None:
    """The run's ``data.json`` (:func:`data_facts`), or None (runs of earlier versions have none)."""
    try:
        return json.loads((Path(run_dir) / DATA_FILE).read_text())
    except (OSError, ValueError):
        return None


class DamagedRecord(ValueError):
    """A run's ``metrics.json`` exists but cannot be read (empty, cut short, not swalab's)."""


def final_metrics(run_dir: str | Path) -> dict | None:
    """The run's final metrics, or None while it has none.

    ``metrics.json`` is the one record that says a run is finished: it is written last, in one atomic step,
    so a run whose ``metrics.json`` reads back is finished whatever ``status.json`` says (a kill right after
    it was written leaves ``status: running`` behind). Raises :class:`DamagedRecord`, naming the file, when
    it exists but does not hold one metrics dict per predictor.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return None
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DamagedRecord(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(metrics, dict) or not any(isinstance(m, dict) and "acc" in m for m in metrics.values()):
        raise DamagedRecord(f"{path} holds no predictor's metrics")
    return metrics


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
    """Each predictor's test probabilities and log-probabilities (float16) and the labels, for analyses that need no
    weights (the report's section 3.5 diagnostics, its ensembles of seeds). The log-probabilities keep a small
    probability that float16 would round to 0 (an ensemble of seeds takes its NLL from them). Left out above
    ``PREDICTIONS_MAX`` numbers per predictor (ImageNet's 50,000 x 1,000 would be 100 MB a predictor)."""
    kept = {name: p.float() for name, p in evaluation.log_probs.items() if p.numel() <= PREDICTIONS_MAX}
    if kept:
        atomic_save({"probs": {name: p.exp().half() for name, p in kept.items()},
                     "log_probs": {name: p.half() for name, p in kept.items()}, "labels": evaluation.labels}, path)
