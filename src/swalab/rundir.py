"""A run directory: the name of every file and folder a run writes there, and the readers and writers of its records.

When it matters: training writes these files; the report, ``model.init_from``, post-hoc averaging and the analyses
read them back. Each takes the names from :class:`RunDir`, and reads a record through it, never through the
package that trains. Every write is atomic (:func:`atomic_write`): a reader never opens half a file, whatever
kills the writer. Only the main rank writes (data-parallel runs share one directory)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

from swalab import distributed, faults
from swalab.logs import RUN_LOG, get_logger


class DamagedRecord(ValueError):
    """A run's ``metrics.json`` exists but cannot be read (empty, cut short, not swalab's)."""


class RunDir:
    """``RunDir(path)``: one run directory's records. ``RunDir.METRICS`` and the like: the names in every run
    directory (``swalab.train``'s module doc says what each holds)."""

    CONFIG, OVERRIDES, IDENTITY, GIT = "config.yaml", "overrides.yaml", "identity.json", "git.json"
    ENVIRONMENT, DATA, LINEAGE, STATUS = "environment.json", "data.json", "lineage.json", "status.json"
    LOG, HISTORY, METRICS, FINAL = RUN_LOG, "history.jsonl", "metrics.json", "final.pt"
    RELIABILITY, PREDICTIONS, WANDB_RUN, WANDB = "reliability.json", "predictions.pt", "wandb_run.json", "wandb"
    CHECKPOINTS, MEMBERS, MEMBER_PROBS = "checkpoints", "members", "fge_member_probs.pt"
    SNAPSHOTS, POSTHOC, SCORES = "snapshots", "posthoc", "scores"  # written later: swalab.snapshots, .posthoc, .results.score
    # Every name a run writes while it trains: a folder that holds one of them but no record of a run
    # (swalab.train.plan.run_record) is no run, and training there would write over a file of the user's. The lock
    # (swalab.runlock) is not among them: it is taken before a run is known.
    FILES = (CONFIG, OVERRIDES, IDENTITY, GIT, ENVIRONMENT, DATA, LINEAGE, STATUS, LOG, HISTORY, METRICS, FINAL,
             RELIABILITY, PREDICTIONS, WANDB_RUN, WANDB, CHECKPOINTS, MEMBERS, MEMBER_PROBS)

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def read_json(self, name: str) -> Any:
        return read_json(self.path / name)

    def config(self) -> dict | None:
        """The resolved config the run wrote (``config.yaml``), or None when it is missing, cannot be read, or holds
        something else than a mapping (damaged, or edited by hand)."""
        import yaml

        try:
            config = yaml.safe_load((self.path / self.CONFIG).read_text()) or {}
        except (OSError, ValueError, yaml.YAMLError):
            return None
        return config if isinstance(config, dict) else None

    def status(self) -> str | None:
        """What ``status.json`` says (a ``swalab.runstatus.RunStatus``: running, preempted, failed, ...), or None
        without one."""
        record = self.read_json(self.STATUS)
        return record.get("status") if isinstance(record, dict) else None

    def write_status(self, status: dict) -> None:
        """``status.json``, best effort: when the disk is full even this small file may not fit, and the
        error being reported matters more than the record of it."""
        try:
            write_json(self.path / self.STATUS, status)
        except OSError as exc:
            get_logger().warning(f"[swalab] could not record status {status.get('status')!r} in {self.path} ({exc})")

    def history(self) -> list[dict]:
        """``history.jsonl``, one dict per epoch, in the order written; [] without one. The trainer rewrites the file
        whole and atomically, so a line that does not read back (cut short by a copy, edited by hand) is skipped
        rather than refusing the run's every other epoch."""
        rows = []
        path = self.path / self.HISTORY
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def final_metrics(self) -> dict | None:
        """The run's final metrics, or None while it has none.

        ``metrics.json`` is the one record that says a run is finished: it is written last, in one atomic step,
        so a run whose ``metrics.json`` reads back is finished whatever ``status.json`` says (a kill right after
        it was written leaves ``status: running`` behind). Raises :class:`DamagedRecord`, naming the file, when
        it exists but does not hold one metrics dict per predictor."""
        path = self.path / self.METRICS
        if not path.exists():
            return None
        try:
            metrics = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DamagedRecord(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
        if not isinstance(metrics, dict) or not any(isinstance(m, dict) and "acc" in m for m in metrics.values()):
            raise DamagedRecord(f"{path} holds no predictor's metrics")
        return metrics


@dataclass(frozen=True)
class WeightSpec:
    """Weights as every command names them: ``<path>[@<epoch>][:<name>]``.

    ``path`` is a run directory or a weights file; ``@<epoch>`` (digits) picks the checkpoint kept after that epoch;
    ``:<name>`` (a word: ``swa``, ``ema``, ``sgd``, ``live``) a method's own weights in a finished run's ``final.pt``.
    Both are read from the end of the spec, so a path may hold ``@`` or ``:`` elsewhere (``runs/lr@0.1/seed0@30``
    is epoch 30 of ``runs/lr@0.1/seed0``). One parser, so that ``model.init_from``, ``run.branch_from``, the
    analyses and post-hoc averaging read one spec the same way."""

    path: Path
    epoch: int | None = None
    name: str = ""

    _NAME = re.compile(r":([A-Za-z_]\w*)$")
    _EPOCH = re.compile(r"@(\d+)$")

    @classmethod
    def parse(cls, spec: str | Path) -> WeightSpec:
        text = str(spec)
        named = cls._NAME.search(text)
        name = named.group(1) if named else ""
        text = text[:named.start()] if named else text
        at = cls._EPOCH.search(text)
        return cls(Path(text[:at.start()] if at else text), int(at.group(1)) if at else None, name)

    def suffix(self) -> str:
        """``@<epoch>:<name>``, each part only when given."""
        return (f"@{self.epoch}" if self.epoch is not None else "") + (f":{self.name}" if self.name else "")

    def relative_to(self, folder: Path) -> str:
        """The spec with its path relative to ``folder``: the same weights typed from another folder read alike."""
        return os.path.relpath(self.path.resolve(), Path(folder).resolve()) + self.suffix()


def earlier_format(what: str, run_dir: str | Path) -> str:
    """The one line refusing ``what`` (a file, a checkpoint's state) of a run in ``run_dir`` that an earlier swalab
    wrote in a format today's code no longer reads, with the command that rewrites the run (``swalab.upgrade``)."""
    return (f"{what} is in the format of an earlier swalab, which this one no longer reads: rewrite the run in "
            f"today's format with python -m swalab.upgrade {run_dir} --write")


def first_line(exc: BaseException) -> str:
    """``<type>: <first line of its message>``: why a file could not be read (or W&B not reached), in one line."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def read_json(path: Path) -> Any:
    """The JSON file at ``path`` read back, or None when it is missing or damaged."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`). Only the main rank writes (data-parallel runs
    share one directory)."""
    if not distributed.is_main():
        return
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=float) + "\n")


def write_record(folder: Path, record: dict, beside: dict[str, Callable[[Path], None]]) -> None:
    """A record of a command run after training (``<run>/scores/<set>/``, ``<run>/posthoc/<label>/``): ``beside``'s
    files (``{name: write(path)}``, each atomic; a writer may write nothing, e.g. predictions above their limit), then
    ``metrics.json``, the record's commit marker, last. The earlier ``metrics.json`` and ``beside``'s earlier files
    are removed first, so a kill or Ctrl-C at any point leaves the earlier record whole, or no record (its folder
    without ``metrics.json``, which every reader skips and the same command writes again), or the new one whole:
    never new predictions beside earlier metrics, which a report or an ensemble of seeds would read as one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RunDir.METRICS).unlink(missing_ok=True)
    for name, write in beside.items():
        (folder / name).unlink(missing_ok=True)
        write(folder / name)
    faults.hit("record_commit")  # test-only: a kill here leaves the files beside, no metrics.json
    write_json(folder / RunDir.METRICS, record)


def file_fingerprint(path: Path) -> str | None:
    """What a weights file holds, read cheaply, or None where it is gone: a post-hoc average records it of every file
    it averaged (``swalab.posthoc``) and is stale once one differs (:func:`changed_files`). A torch file is a zip
    archive whose directory, at its end, holds the CRC-32 and size of every record: its hash (``zip-<16 hex>``) reads
    that directory only, no tensor (a 146 MB snapshot costs a few kilobytes), changes with any weight written anew and
    not with a copy (``cp``, ``rsync``) or a rewrite of the same weights (an exact resume). Any other file: the
    sha256 of its bytes (``sha256-<16 hex>``)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:  # a record's name starts with the archive's, which torch takes from
            records = sorted((i.filename.split("/", 1)[-1], i.CRC, i.file_size) for i in archive.infolist())  # the file
        return "zip-" + hashlib.sha256(json.dumps(records).encode()).hexdigest()[:16]
    except (zipfile.BadZipFile, OSError):
        pass
    try:
        return "sha256-" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def changed_files(run_dir: Path, fingerprints: dict[str, str]) -> list[str]:
    """The files of ``fingerprints`` (``{path relative to run_dir: file_fingerprint}``) that hold something else now.
    A file that is gone says nothing: a record built from it (a post-hoc average, scores on other data) stays valid
    when snapshots or checkpoints are removed to free disk; training again rewrites ``final.pt``, which is there."""
    now = {name: file_fingerprint(Path(run_dir) / name) for name in fingerprints}
    return [name for name, was in fingerprints.items() if now[name] is not None and now[name] != was]
