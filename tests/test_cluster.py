"""The SLURM launcher config composes with the submitit plugin (skipped when it is not installed)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF_DIR


def test_the_slurm_launcher_config_composes_over_the_plugins_own(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher is optional: pip install -e .[slurm]")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "logger=none"])
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.swalab_slurm.SlurmLauncher"  # the plugin's, quiet without sacct
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min) == ("gpu", 1, 720)
    assert launcher.max_num_timeout > 0  # a job that reaches its time limit is requeued and resumes
