"""Offline W&B runs read back from their ``.wandb`` files: what ``wandb sync`` would upload.

A ``.wandb`` file is W&B's record log (a LevelDB-style log of ``wandb.proto`` ``Record`` messages:
a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte header: checksum, length,
type full/first/middle/last). wandb 0.31 reads it in its Go core only, so the tests read it here.
A resumed run writes one ``offline-run-<time>-<id>`` folder per launch; :func:`read_runs` merges them
in launch order, as ``wandb sync`` uploads them. W&B's service process writes the file on its own
and may still be writing when ``run.finish()`` has returned: :func:`read_runs` waits for each file's
``exit`` record.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator[pb.Record]:
    data = Path(path).read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B record log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    step_metrics: dict[str, str] = field(default_factory=dict)   # metric or glob -> its x-axis
    segments: list[Path] = field(default_factory=list)           # one offline-run-* folder per launch

    @property
    def epochs(self) -> list[int]:
        return [int(row["epoch"]) for row in self.history if "epoch" in row and "train_loss" in row]


def complete_records(path: Path, wait: float) -> list[pb.Record]:
    """The records of ``path`` once its ``exit`` record is written (at most ``wait`` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        found = list(records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def read_segment(path: Path, run: OfflineRun, wait: float = 15.0) -> None:
    for record in complete_records(path, wait):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id, run.name, run.group, run.job_type = r.run_id, r.display_name, r.run_group, r.job_type
            run.tags = list(r.tags)
            for item in r.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "metric":
            m = record.metric
            if m.step_metric:
                run.step_metrics[m.name or m.glob_name] = m.step_metric


def read_runs(wandb_dir: str | Path) -> dict[str, OfflineRun]:
    """Every offline run below ``wandb_dir`` (``<run>/wandb``), by W&B run id."""
    runs: dict[str, OfflineRun] = {}
    for folder in sorted(Path(wandb_dir).glob("offline-run-*")):  # names start with the launch time
        for path in folder.glob("*.wandb"):
            run_id = path.stem.removeprefix("run-")
            run = runs.setdefault(run_id, OfflineRun())
            run.segments.append(folder)
            read_segment(path, run)
    return runs
