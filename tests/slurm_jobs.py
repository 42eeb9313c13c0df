"""Helpers of the cluster tests (tests/test_cluster*.py): launch ``run.py`` locally or through
``hydra/launcher=slurm``, find the SLURM job of a grid, wait for a run to reach a point, compare two runs.

Every command pins ``OMP_NUM_THREADS=1``: the number of threads changes the order of float sums, and the
comparisons here are bit for bit (a SLURM job inherits the variable from the submitting shell).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from swalab import faults
from swalab.slurm import job_record

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TORCHRUN = [PYTHON, "-m", "torch.distributed.run"]
# one small job: the bundled digits, PreResNet-8, no logger
TINY = ["logger=none", "run.progress=false", "model.arch.depth=8", "run.device=cpu"]
# a SLURM job of one CPU task on the local cluster (tests/cluster/slurm-up)
SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=1"]


def env(fault: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command here (and of the SLURM jobs it submits)."""
    base = {k: v for k, v in os.environ.items() if k not in (faults.ENV, "SUBMITIT_PREEMPT_SIGNAL")}
    base.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", **extra)
    if fault:
        base[faults.ENV] = fault
    return base


def run(*args: str, timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    """``args`` from the repository root, to completion, output captured."""
    kwargs.setdefault("env", env())
    return subprocess.run(list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)


def start(*args: str, log: Path, **kwargs) -> subprocess.Popen:
    """``args`` in the background, stdout and stderr to ``log``."""
    kwargs.setdefault("env", env())
    out = open(log, "w")
    return subprocess.Popen(list(args), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)


def wait_for(check: Callable[[], object], what: str, timeout: float = 300, every: float = 1.0):
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def only_run_dir(output_dir: Path) -> Path:
    """The one run directory under ``output_dir`` (a grid of one job)."""
    found = [p.parent for p in output_dir.rglob("identity.json") if "grids" not in p.parts]
    assert len(found) == 1, found
    return found[0]


def slurm_job_ids(output_dir: Path) -> list[str]:
    """The SLURM job ids of the grids under ``output_dir`` (``<array>_<index>`` for a grid of several jobs), from
    submitit's folders: one per job, holding its pickled call (and one per array, for its submission script)."""
    return sorted(p.parent.name for p in output_dir.glob("grids/*/.submitit/*/*_submitted.pkl"))


def squeue_line(job: str) -> str:
    out = run("squeue", "-h", "-j", job, "-o", "%i %P %T %r %N", timeout=30)
    return out.stdout.strip()


def restarts(job: str) -> int:
    return int(job_record(job).get("Restarts", "0"))


def history(run_dir: Path) -> list[dict]:
    """history.jsonl without the wall-clock column."""
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def assert_same_weights(run: Path, reference: Path) -> None:
    """final.pt (live weights and each method's own) equal bit for bit, and the same metrics.json."""
    a = torch.load(run / "final.pt", weights_only=False)
    b = torch.load(reference / "final.pt", weights_only=False)
    states = [("model", a["model"], b["model"])] + [(k, a["methods"][k], v) for k, v in b["methods"].items()]
    for name, ours, theirs in states:
        assert ours.keys() == theirs.keys()
        unequal = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
        assert not unequal, f"{name} of {run} differs from {reference} in {unequal[:5]}"
    assert json.loads((run / "metrics.json").read_text()) == json.loads((reference / "metrics.json").read_text())


def assert_same_run(run: Path, reference: Path) -> None:
    """Weights, metrics and history (but the seconds) equal bit for bit, and the run complete."""
    assert_same_weights(run, reference)
    assert history(run) == history(reference)
    assert json.loads((run / "status.json").read_text())["status"] == "complete"
