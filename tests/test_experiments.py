"""Every conf/experiment and conf/sweep file composes, names the paper's numbers, and every job it
launches (each combination of its hydra.sweeper.params) passes the checks a run makes before training."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import CONF_DIR, QUIET
from swalab.config import ConfigError
from swalab.train import validate

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))
TABLE1 = [e for e in EXPERIMENTS if e.startswith("table1_")]
# what the experiments' own comments say must be given on the command line
REQUIRED = {"fig6_swa_lr_study": ["model.init_from=some/sgd/run@125"],
            "sec35_fge_vs_swa": ["model.init_from=some/sgd/run@120"],
            "cifar10jpg_small": ["dataset.root=some/cifar10-jpg"]}


def compose_with_hydra(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*QUIET, *overrides], return_hydra_config=True)


def jobs_of(selection: str) -> list[list[str]]:
    """The overrides of every job ``python run.py -m <selection>`` launches (the sweeper's cartesian product)."""
    params = OmegaConf.select(compose_with_hydra(selection), "hydra.sweeper.params") or {}
    parser = OverridesParser.create()
    axes = [[f"{key}={value}" for value in parser.parse_override(f"{key}={spec}").sweep_string_iterator()]
            for key, spec in params.items()]
    return [list(job) for job in itertools.product(*axes)]


def every_job():
    for name in EXPERIMENTS:
        for job in jobs_of(f"experiment={name}"):
            yield pytest.param([f"experiment={name}", *REQUIRED.get(name, []), *job], id=f"{name}:{','.join(job)}")
    for name in SWEEPS:
        for job in jobs_of(f"+sweep={name}"):
            yield pytest.param([f"+sweep={name}", *REQUIRED.get(name, []), *job], id=f"{name}:{','.join(job)}")


@pytest.mark.parametrize("overrides", list(every_job()))
def test_every_job_of_every_experiment_and_sweep_builds_its_method_and_validates(overrides):
    cfg = compose_with_hydra(*overrides)
    method = validate(cfg)  # schedule and method built with the run's epochs, then the method's own checks
    assert method.name == cfg.method.name and method.epochs == cfg.trainer.epochs


def test_the_figure_7_grid_runs_both_of_its_methods():
    assert sorted(job[0] for job in jobs_of("experiment=fig7_constant_vs_decay")) == ["method=sgd", "method=swa"]
    swa = validate(compose_with_hydra("experiment=fig7_constant_vs_decay", "method=swa"))
    assert (swa.start_epoch, swa.lr, swa.score_every, swa.epochs) == (140, 0.05, 1, 300)


def test_every_experiment_config_names_itself_and_is_global():
    for experiment in EXPERIMENTS:
        assert compose_with_hydra(f"experiment={experiment}").hydra.runtime.choices.experiment == experiment
        assert (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text().startswith("# @package _global_")


def test_there_is_one_table1_experiment_per_cifar_row():
    assert TABLE1 == sorted(f"table1_{d}_{m}" for d in ("cifar10", "cifar100")
                            for m in ("preresnet164", "vgg16", "wrn28_10"))
    assert "sec35_fge_vs_swa" in EXPERIMENTS


@pytest.mark.parametrize("experiment", TABLE1)
def test_table1_experiment_sweeps_sgd_fge_swa_at_the_papers_budgets(experiment):
    _, dataset, model = experiment.split("_", 2)
    cfg = compose_with_hydra(f"experiment={experiment}")
    assert cfg.dataset.name == dataset and cfg.model.name == model
    assert cfg.hydra.sweeper.params.method == "sgd,fge,swa"
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    assert text.count("±") >= 4  # the paper's cells are named
    budgets = {}
    for method in ("sgd", "fge", "swa"):
        job = compose_with_hydra(f"experiment={experiment}", f"method={method}")
        m = validate(job)
        budgets[method] = job.trainer.epochs / job.model.budget_epochs
        if method == "swa":
            assert list(m.score_at_budgets) == [1.0, 1.25]
            assert m.start_epoch == {"vgg16": 161, "wrn28_10": 161, "preresnet164": 126}[model]  # the reference code
    assert budgets == {"sgd": 1.0, "fge": 1.0, "swa": 1.5}


def test_sec35_experiment_runs_fge_from_a_required_pretrained_start():
    cfg = compose_with_hydra("experiment=sec35_fge_vs_swa")
    assert (cfg.dataset.name, cfg.model.name, cfg.method.name) == ("cifar100", "preresnet164", "fge")
    assert cfg.trainer.epochs == 20 and cfg.model.fge.pretrain_epochs == 0 and cfg.model.fge.save_members
    with pytest.raises(ConfigError, match="model.init_from"):  # the start must be given on the command line
        validate(cfg)
    text = (CONF_DIR / "experiment" / "sec35_fge_vs_swa.yaml").read_text()
    for number in ("0.126", "0.079", "87.33%", "95.26%"):
        assert number in text
    m = validate(compose_with_hydra("experiment=sec35_fge_vs_swa", "model.init_from=some/run@120"))
    assert sum(m.is_collection_epoch(e) for e in range(20)) == 10


@pytest.mark.parametrize("model", ["resnet50", "resnet152", "densenet161"])
def test_table2_scores_the_pretrained_weights_and_swa_at_5_and_10_epochs(model):
    pretrained = validate(compose_with_hydra(f"experiment=table2_{model}", "method=pretrained"))
    assert pretrained.epochs == 0  # nothing trains, whatever the experiment says for its other methods
    swa = validate(compose_with_hydra(f"experiment=table2_{model}"))
    assert (swa.epochs, swa.start_epoch, [swa.epoch_of(b) for b in swa.score_at_budgets]) == (10, 0, [5])
