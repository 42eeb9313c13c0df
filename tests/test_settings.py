"""The trainer and run groups: each setting defined, typed, commented and checked once (``swalab.settings``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from conftest import REPO
from swalab.config import ConfigError
from swalab.settings import RunSettings, TrainerOptions, TrainerSettings

QUIET = ["logger=none", "run.progress=false"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_trainer_and_run_groups_are_composed_from_their_settings_classes(make_cfg):
    cfg = make_cfg()
    assert OmegaConf.get_type(cfg.trainer) is TrainerSettings and OmegaConf.get_type(cfg.run) is RunSettings
    assert list(cfg.trainer) == [f.name for f in fields(TrainerSettings)]
    assert list(cfg.run) == [f.name for f in fields(RunSettings)]
    assert not (REPO / "conf" / "trainer").exists() and not (REPO / "conf" / "run").exists()  # defined once: in code


def test_every_setting_is_commented_where_its_class_defines_it():
    source = (REPO / "src" / "swalab" / "settings.py").read_text().splitlines()
    for cls in (TrainerSettings, RunSettings):
        for f in fields(cls):
            line = next(line for line in source if line.lstrip().startswith(f"{f.name}:"))
            assert "  # " in line and len(line.split("  # ", 1)[1]) > 10, f"{f.name} has no comment"


def test_a_setting_of_the_wrong_type_is_refused_while_the_config_is_composed(make_cfg):
    with pytest.raises(ConfigCompositionException) as refused:
        make_cfg("trainer.batch_size=abc")
    assert "trainer.batch_size" in str(refused.value.__cause__)


@pytest.mark.parametrize("override, message", [
    ("trainer.batch_size=abc", "trainer.batch_size='abc' must be an integer"),
    ("trainer.accumulate=2.5", "trainer.accumulate=2.5 must be an integer"),
    ("run.keep_checkpoints=[1]", "run.keep_checkpoints=[1] must be an integer"),
    ("run.save_at=[one]", "run.save_at=['one'] must be a list of integers"),
])
def test_the_command_line_refuses_a_setting_of_the_wrong_type_in_one_line_with_exit_2_and_creates_nothing(
        tmp_path, override, message):
    done = cli(*QUIET, override, f"paths.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"[swalab] {message}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_grid_with_one_value_of_the_wrong_type_is_refused_before_any_job_runs(tmp_path):
    done = cli("-m", *QUIET, "trainer.batch_size=64,abc", f"paths.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["[swalab] trainer.batch_size='abc' must be an integer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_loops_options_are_checked_by_their_owner_however_they_are_built():
    """Code that builds a Trainer itself (a notebook, a benchmark) gets the checks a run's config gets."""
    with pytest.raises(ConfigError, match=r"trainer.batch_size=0 must be >= 1"):
        TrainerOptions(epochs=2, batch_size=0)
    with pytest.raises(ConfigError, match=r"trainer.bn_update_fraction=nan must be a finite number"):
        TrainerOptions(epochs=2, bn_update_fraction=float("nan"))
    with pytest.raises(ConfigError) as both:
        TrainerOptions(epochs=2, nonfinite="ignore", resume="sometimes")
    assert "trainer.nonfinite='ignore' must be 'stop' or 'skip'" in str(both.value)
    assert "run.resume='sometimes' must be auto, true or false" in str(both.value)


def test_every_bad_trainer_and_run_value_is_listed_in_one_refusal(make_cfg):
    from swalab.train import validate

    with pytest.raises(ConfigError) as refused:
        validate(make_cfg("trainer.batch_size=0", "run.heartbeat_minutes=-1", "dataset.train_size=0"))
    lines = str(refused.value).splitlines()
    assert lines[0] == "invalid config:"
    assert {"  - trainer.batch_size=0 must be >= 1", "  - run.heartbeat_minutes=-1 must be >= 0",
            "  - dataset.train_size=0 must be >= 1"} <= set(lines)


def test_a_key_added_to_the_trainer_group_in_python_is_refused_naming_it(make_cfg):
    from swalab.train import validate

    with pytest.raises(ConfigError, match=r"trainer.foo is not a setting of trainer \(swalab.settings.TrainerSettings"):
        validate(make_cfg("+trainer.foo=1"))



def test_a_single_bad_value_is_refused_in_one_line_naming_it(make_cfg):
    from swalab.train import validate

    with pytest.raises(ConfigError) as refused:
        validate(make_cfg("trainer.batch_size=0"))
    assert str(refused.value) == "invalid config: trainer.batch_size=0 must be >= 1"
