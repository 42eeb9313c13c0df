"""Shared test fixtures: compose the real Hydra config exactly as run.py does, without a Hydra run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import swalab  # noqa: F401  (registers resolvers)

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
CIFAR10_JPG = Path(os.environ.get("SWALAB_CIFAR10_JPG", REPO.parent / "shared" / "data" / "cifar10-jpg"))

# Decoded images and file digests are cached below $XDG_CACHE_HOME/swalab (swalab.data.cache): the tests keep theirs
# in a folder of their own, shared by every test of the session (and the processes they start), never the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="swalab-tests-cache-")

# settings that keep a test run small, quiet and offline
QUIET = ["logger=none", "run.progress=false"]


@pytest.fixture(autouse=True)
def threads_left_as_found():
    """No test leaves torch's thread count changed: it sets the order of float sums in every later test that compares
    an in-process run with a ``python run.py`` child bit for bit."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One torch thread for this test, as in the worker processes it compares with."""
    torch.set_num_threads(1)


def train_on_one_thread(run_dir: Path, *overrides: str) -> Path:
    """Train the run of ``overrides`` (plus the quiet test settings) into ``run_dir`` in this process, on one torch
    thread, putting the count back afterwards: for module-scoped fixtures, which ``one_thread`` (per test) cannot
    serve."""
    from swalab.train import train

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*QUIET, *overrides])
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, run_dir=run_dir)
    finally:
        torch.set_num_threads(before)
    return run_dir


@pytest.fixture
def make_cfg():
    """``make_cfg(*overrides)``: the composed config for those overrides (plus quiet test settings)."""

    def _make(*overrides: str):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=[*QUIET, *overrides])

    return _make


@pytest.fixture
def cifar10_jpg() -> Path:
    if not (CIFAR10_JPG / "train").is_dir():
        pytest.skip(f"real CIFAR-10 JPEG copy not found at {CIFAR10_JPG} (set SWALAB_CIFAR10_JPG)")
    return CIFAR10_JPG


# -- the local SLURM cluster (tests/cluster/slurm-up) for the tests marked `cluster` ----------------------------
SLURM_DIR = Path(os.environ.get("SWALAB_SLURM_DIR", "/tmp/swalab-slurm"))


def slurm_unavailable() -> str | None:
    """Why the cluster tests cannot run here, or None when a SLURM cluster answers (and SLURM_CONF is set)."""
    import importlib.util
    import shutil
    import subprocess

    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        return "hydra-submitit-launcher is not installed: pip install -e .[slurm]"
    if shutil.which("sinfo") is None:
        failed = SLURM_DIR / "failed"
        if failed.is_file():
            return f"tests/cluster/slurm-up could not start SLURM: {failed.read_text().strip()}"
        return "SLURM is not installed: start a local cluster with tests/cluster/slurm-up (as root; apt-installs it)"
    conf = os.environ.get("SLURM_CONF") or str(SLURM_DIR / "slurm.conf")
    if not Path(conf).is_file():
        failed = SLURM_DIR / "failed"
        if failed.is_file():
            return f"tests/cluster/slurm-up could not start SLURM: {failed.read_text().strip()}"
        return f"no SLURM cluster is running here (no {conf}): start one with tests/cluster/slurm-up"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "SLURM_CONF": conf})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo did not answer ({exc})"
    states = out.stdout.split()
    if out.returncode != 0 or not states:
        return (f"no SLURM cluster answers at SLURM_CONF={conf} ({out.stderr.strip()[:200] or 'no node'}): start one "
                "with tests/cluster/slurm-up")
    if not any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states):
        return f"the SLURM node is not up (sinfo: {', '.join(states)})"
    os.environ["SLURM_CONF"] = conf  # the jobs and the tests' own squeue/scontrol calls use it
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """SLURM_CONF of the running local cluster; the test is skipped, with the reason, when there is none."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    return os.environ["SLURM_CONF"]
