"""A setting that cannot act in the run as configured is refused before anything is written, or, where a grid runs
it legitimately (one list or one default shared by jobs of several lengths), said once at launch with the key and the
numbers: never accepted in silence."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO
from swalab.config import ConfigError
from swalab.train import prepare

QUIET = ["logger=none", "run.progress=false"]
TINY = [*QUIET, "dataset.train_size=128", "trainer.batch_size=64", "model.arch.depth=8", "run.eval_every=0"]


def cli(tmp_path, *args):
    return subprocess.run([sys.executable, str(REPO / "run.py"), *TINY, *args, f"paths.output_dir={tmp_path / 'out'}"],
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)


def test_an_swa_average_of_one_model_is_refused_in_one_line_before_anything_is_written(tmp_path):
    done = cli(tmp_path, "method=swa", "trainer.epochs=2", "model.swa.capture_every=100")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "[swalab] the SWA average would hold 1 model in a run of trainer.epochs=2: model.swa.phase=constant captures "
        "every model.swa.capture_every=100 epochs from epoch 1 (model.swa.start=0.8125 of B=1.33333), and an average "
        "needs 2 at least (one model is the SGD iterate, not an average). Lower model.swa.start, lower "
        "model.swa.capture_every, or lengthen the run (trainer.epochs)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("phase", ["constant", "swalr", "cyclic"])
def test_every_swa_phase_refuses_an_average_of_one_model_and_swag_with_it(tmp_path, make_cfg, phase):
    spacing = {"constant": ["model.swa.capture_every=3"], "swalr": ["model.swa.capture_every=3",
                                                                   "model.swa.anneal_epochs=0"],
               "cyclic": ["model.swa.cycle_epochs=3", "model.swa.lr_min=0.001"]}[phase]
    for method in ("swa", "swag"):
        overrides = [*TINY, f"method={method}", "trainer.epochs=4", "model.swa.start_epoch=2",
                     f"model.swa.phase={phase}", *spacing]
        with pytest.raises(ConfigError, match=r"the SWA average would hold (1 model|0 models) in a run of trainer.epochs=4"):
            prepare(make_cfg(*overrides), run_dir=tmp_path / "run")
        prepare(make_cfg(*overrides, "trainer.epochs=8"), run_dir=tmp_path / "run")  # long enough: 2 models
    assert not (tmp_path / "run").exists()


def test_a_swalr_anneal_longer_than_the_run_is_refused_naming_the_key(tmp_path, make_cfg):
    overrides = [*TINY, "method=swa", "trainer.epochs=4", "model.swa.phase=swalr"]
    with pytest.raises(ConfigError, match=r"model.swa.anneal_epochs=50 anneals the lr from epoch 2 on, but "
                                          r"trainer.epochs=4 ends 2 epochs later: the lr never reaches model.swa.lr"):
        prepare(make_cfg(*overrides, "model.swa.anneal_epochs=50"), run_dir=tmp_path / "run")
    prepare(make_cfg(*overrides, "model.swa.start_epoch=1", "model.swa.anneal_epochs=2"), run_dir=tmp_path / "run")


def test_a_save_at_epoch_beyond_the_run_is_said_at_launch_with_the_key_and_the_run_length(tmp_path, make_cfg, caplog):
    prepare(make_cfg(*TINY, "method=sgd", "trainer.epochs=2", "run.save_at=[1,100]"), run_dir=tmp_path / "run")
    assert ("run.save_at=[1, 100]: epoch 100 is beyond this run's trainer.epochs=2, so no checkpoint is kept for it"
            in caplog.text)
    caplog.clear()
    prepare(make_cfg(*TINY, "method=sgd", "trainer.epochs=2", "run.save_at=[2]"), run_dir=tmp_path / "run")
    assert "run.save_at" not in caplog.text


def test_a_swag_rank_above_the_captures_of_the_run_is_said_at_launch_with_the_numbers(tmp_path, make_cfg, caplog):
    base = [*TINY, "method=swag", "trainer.epochs=4", "model.swa.start_epoch=2"]  # captures after epochs 2, 3 and 4
    prepare(make_cfg(*base, "method.rank=20"), run_dir=tmp_path / "run")
    assert ("method.rank=20 but the run captures 3 models (model.swa.phase=constant captures every "
            "model.swa.capture_every=1 epochs from epoch 2): the low-rank covariance holds 3 deviations (rank 3 in "
            "metrics.json). Lower method.rank to 3, or capture more" in caplog.text)
    caplog.clear()
    prepare(make_cfg(*base, "method.rank=3"), run_dir=tmp_path / "run")
    assert "method.rank" not in caplog.text
