"""What a run records besides its names and atomic writes (``swalab.rundir``): seeds, ``git.json`` and
``environment.json`` entries, ``data.json``'s facts, the temp files a kill leaves behind, and
the ``<type>: <first line>`` form of an error that ``status.json`` and a grid's summary keep."""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from swalab.cli import message
from swalab.data.splits import pixel_max
from swalab.precision import training_dtype
from swalab.rundir import RunDir, write_json


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


def environment_entry(device, git: dict, precision: str = "auto", compile: str | None = None,
                      deterministic: bool = True) -> dict:
    """What a run's numbers depend on beyond its config, as this process runs it: when it started, the commit
    (``git``, from :func:`git_info`), torch's version, its CPU thread count and the device (on CUDA with the GPU's
    name), the autocast its training steps run in (``training_autocast``: what ``trainer.precision``, e.g.
    ``auto``, resolved to on this device), and the two run settings that change a run's rounding without changing its
    identity: ``compile`` (``run.compile``'s torch.compile mode, ``off`` when not compiled) and ``deterministic``
    (``run.deterministic``). A run resumed with other values of them says so in its next entry, where config.yaml
    holds only the latest start's. The thread count matters on a CPU:
    it changes the order of float sums, so a run is reproduced bit for bit only at the same count
    (docs/cluster.md); a run resumed at another count says so in its second entry."""
    device = torch.device(device)
    dtype = training_dtype(device, precision)
    entry = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), **git, "torch": torch.__version__,
             "threads": torch.get_num_threads(), "device": str(device),
             "training_autocast": "float32 (none)" if dtype is None else str(dtype).removeprefix("torch."),
             "compile": compile or "off", "deterministic": deterministic}
    if device.type == "cuda":
        entry["device_name"] = torch.cuda.get_device_name(device)
    return entry


def append_environment(run_dir: str | Path, entry: dict) -> None:
    """Add ``entry`` to the run's ``environment.json``, one entry per time the run started or resumed."""
    entries = RunDir(run_dir).read_json(RunDir.ENVIRONMENT)
    write_json(RunDir(run_dir) / RunDir.ENVIRONMENT, [*(entries if isinstance(entries, list) else []), entry])


# The temp name atomic_write and atomic_save give a file while they write it (tempfile.mkstemp's 8 random characters).
KILLED_WRITE = re.compile(r"^[\w@+-][\w.@+-]*\.[a-z0-9_]{8}\.tmp$")
WRITTEN_IN = ("", RunDir.MEMBERS, RunDir.CHECKPOINTS, f"{RunDir.CHECKPOINTS}/predictions", f"{RunDir.CHECKPOINTS}/saved")  # the run's folders


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


def one_line(exc: BaseException) -> str:
    """``<type>: <first line of its message>``: what status.json and a grid's summary record. A first line
    that introduces a list (``invalid config:`` then ``  - seed='abc' must be an integer``) keeps the list's
    items, joined by ``;``, so the line still names the key to fix."""
    text = [line.strip() for line in message(exc).splitlines() if line.strip()]
    first = text[0] if text else ""
    if first.endswith(":") and len(text) > 1:
        first += " " + "; ".join(line.removeprefix("- ") for line in text[1:] if line.startswith("- "))
    return f"{type(exc).__name__}: {first}".rstrip(": ")
