"""Every conf/experiment file composes, names the paper's numbers, and sweeps methods that validate."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from conftest import CONF_DIR, QUIET

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
TABLE1 = [e for e in EXPERIMENTS if e.startswith("table1_")]


def compose_with_hydra(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*QUIET, *overrides], return_hydra_config=True)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_composes(experiment):
    cfg = compose_with_hydra(f"experiment={experiment}")
    assert cfg.hydra.runtime.choices.experiment == experiment
    assert (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text().startswith("# @package _global_")


def test_there_is_one_table1_experiment_per_cifar_row():
    assert TABLE1 == sorted(f"table1_{d}_{m}" for d in ("cifar10", "cifar100")
                            for m in ("preresnet164", "vgg16", "wrn28_10"))
    assert "sec35_fge_vs_swa" in EXPERIMENTS


@pytest.mark.parametrize("experiment", TABLE1)
def test_table1_experiment_sweeps_sgd_fge_swa_and_every_job_validates(make_cfg, experiment):
    _, dataset, model = experiment.split("_", 2)
    cfg = compose_with_hydra(f"experiment={experiment}")
    assert cfg.dataset.name == dataset and cfg.model.name == model
    assert cfg.hydra.sweeper.params.method == "sgd,fge,swa"
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    assert text.startswith("# @package _global_") and text.count("±") >= 4  # the paper's cells are named
    budgets = {}
    for method in ("sgd", "fge", "swa"):
        job = make_cfg(f"experiment={experiment}", f"method={method}")
        sched = instantiate(job.schedule)
        m = instantiate(job.method, _partial_=True, _convert_="all")(schedule=sched)
        m.validate(int(job.trainer.epochs), initialized=False)
        budgets[method] = job.trainer.epochs / job.model.budget
        if method == "swa":
            assert list(m.eval_at_budgets) == [1.0, 1.25]
    assert budgets == {"sgd": 1.0, "fge": 1.0, "swa": 1.5}


def test_sec35_experiment_runs_fge_from_a_required_pretrained_start(make_cfg):
    cfg = make_cfg("experiment=sec35_fge_vs_swa")
    assert (cfg.dataset.name, cfg.model.name, cfg.method.name) == ("cifar100", "preresnet164", "fge")
    assert cfg.trainer.epochs == 20 and cfg.method.pretrain_epochs == 0 and cfg.method.save_members
    m = instantiate(cfg.method, _partial_=True, _convert_="all")(schedule=instantiate(cfg.schedule))
    with pytest.raises(ValueError, match="trainer.init_from"):  # the start must be given on the command line
        m.validate(20, initialized=cfg.trainer.init_from is not None)
    text = (CONF_DIR / "experiment" / "sec35_fge_vs_swa.yaml").read_text()
    for number in ("0.126", "0.079", "87.33%", "95.26%"):
        assert number in text
    cfg = make_cfg("experiment=sec35_fge_vs_swa", "trainer.init_from=some/run@120")
    m = instantiate(cfg.method, _partial_=True, _convert_="all")(schedule=instantiate(cfg.schedule))
    m.validate(20, initialized=True)
    assert sum(m.is_collection_epoch(e) for e in range(20)) == 10
