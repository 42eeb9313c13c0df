"""Shared test fixtures: compose the real Hydra config exactly as run.py does, without a Hydra run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
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
