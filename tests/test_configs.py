"""Every config in every group composes, and its objects instantiate."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf

from conftest import CONF_DIR
from swalab.config import ConfigError, epochs_of_budget
from swalab.tracking import NullTracker
from swalab.train import validate
from swalab.train.build import build_method


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("model", options("model"))
def test_every_model_config_composes_and_builds(make_cfg, model):
    own = ["model.arch._target_=swalab.models.VGG16"] if model == "custom" else []  # custom: your class
    cfg = make_cfg(f"model={model}", "dataset=cifar100", "method=swa", *own)
    expected = {"timm": "resnet18.tv_in1k", "custom": "VGG16"}.get(model, model)  # timm: the timm name; custom: the class
    assert cfg.model.name == expected
    assert cfg.trainer.epochs == round(1.5 * cfg.model.budget_epochs)  # SWA's default budget is 1.5 B
    for key in ("lr", "weight_decay", "budget_epochs", "swa", "fge"):
        assert key in cfg.model, f"conf/model/{model}.yaml lacks the recipe key {key!r}"
    from swalab.methods import FGE, SWA
    from swalab.train.build import arguments_of

    passed = ("self", "schedule", "epochs", "budget", "name", "avg_device")  # what swalab or the method's yaml sets
    for block, cls in (("swa", SWA), ("fge", FGE)):  # every argument of SWA/FGE is a key of every model's block
        keys = [p for p in arguments_of(cls) if p not in passed]
        assert sorted(cfg.model[block]) == sorted(keys), f"conf/model/{model}.yaml {block}: {sorted(cfg.model[block])}"
    net = instantiate(cfg.model.arch, num_classes=100, in_channels=3)  # as train.build_model passes the data's
    head = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert head.out_features == 100


@pytest.mark.parametrize("dataset", options("dataset"))
def test_every_dataset_config_composes(make_cfg, dataset):
    cfg = make_cfg(f"dataset={dataset}", *([f"dataset.root=/data/{dataset}"] if dataset == "folder" else []))
    assert cfg.dataset.name == dataset  # a folder data set is named after its folder
    if cfg.dataset.mean is not None:  # null (dataset=folder): channels, mean and std are measured on the data
        assert len(cfg.dataset.mean) == len(cfg.dataset.std) == cfg.dataset.channels
    assert callable(get_method(cfg.dataset.source._target_))


@pytest.mark.parametrize("method", options("method"))
@pytest.mark.parametrize("schedule", options("schedule"))
def test_every_method_and_schedule_instantiates(make_cfg, method, schedule):
    recipe = {"swa": "swa", "swag": "swa", "fge": "fge"}.get(method)  # the model's recipe block the method reads
    base = [f"model.{recipe}.pre_schedule=base"] if recipe else []  # the schedule group is the one used
    split = ["dataset.val_size=100"] if method == "laplace" else []  # Laplace chooses its prior on a validation split
    cfg = make_cfg(f"method={method}", f"schedule={schedule}", "model.init_from=some/run", *base, *split)
    m = validate(cfg)
    assert m.name == method
    if method not in ("pretrained", "laplace"):  # they train nothing
        assert m.schedule(0.0) > 0 and m.lr_at(0, 0, 10) > 0


@pytest.mark.parametrize("method", ["swa", "fge"])
def test_a_schedule_the_reference_pre_schedule_would_ignore_is_refused(make_cfg, method):
    """``schedule=cosine`` with SWA's default ``model.swa.pre_schedule=reference`` trained the paper's schedule and
    gave the same numbers as the default run, in a directory of its own: now refused, naming the fix."""
    with pytest.raises(ConfigError, match=f"would ignore the chosen schedule .*set model.{method}.pre_schedule=base"):
        validate(make_cfg(f"method={method}", "schedule=cosine", f"model.{method}.pre_schedule=reference"))
    validate(make_cfg(f"method={method}", "schedule=paper_sgd", f"model.{method}.pre_schedule=reference"))


def test_digits_data_instantiates_from_config(make_cfg):
    cfg = make_cfg()
    data = instantiate(cfg.dataset.source)
    assert data.num_classes == cfg.dataset.num_classes == 10
    assert tuple(data.train.images.shape[1:]) == (1, 8, 8)


def test_loggers_instantiate(make_cfg, tmp_path):
    tracker = instantiate(make_cfg("logger=none").logger, _partial_=True)(run_dir=str(tmp_path), run_config={})
    assert isinstance(tracker, NullTracker)
    cfg = make_cfg("logger=wandb")
    assert cfg.logger.mode == "offline" and cfg.logger._target_.endswith("WandbTracker")


def test_paper_recipes_reach_the_config(make_cfg):
    """Per-model values of the paper and its reference code, and the per-(dataset, model) specialisation."""
    wrn = make_cfg("method=swa", "model=wrn28_10", "dataset=cifar100", "method.budget=1.5")
    assert (wrn.trainer.epochs, build_method(wrn, 300).start_epoch, wrn.model.swa.lr, wrn.schedule.lr) == (300, 161, 0.05, 0.1)
    assert wrn.optimizer.weight_decay == 5e-4 and wrn.trainer.batch_size == 128 and wrn.optimizer.momentum == 0.9
    assert make_cfg("model=preresnet164", "dataset=cifar100", "method=swa").model.swa.lr == 0.05
    assert make_cfg("model=preresnet164", "dataset=cifar10", "method=swa").model.swa.lr == 0.01
    vgg = make_cfg("model=vgg16", "method=sgd", "dataset=cifar10")
    assert (vgg.trainer.epochs, vgg.schedule.lr, vgg.optimizer.weight_decay) == (200, 0.05, 5e-4)
    assert list(vgg.model.mean) == [0.485, 0.456, 0.406]
    fge = make_cfg("model=preresnet164", "method=fge", "dataset=cifar100")
    assert (fge.trainer.epochs, build_method(fge, 150).pretrain_epochs, fge.model.fge.cycle_epochs) == (150, 120, 2)
    swa = make_cfg("model=preresnet164", "method=swa", "dataset=cifar10")  # the reference code: 126 of 225
    assert (swa.trainer.epochs, build_method(swa, 225).start_epoch) == (225, 126)


def test_sgd_baseline_config_is_the_papers(make_cfg):
    cfg = make_cfg("method=sgd", "model=wrn28_10", "dataset=cifar100")
    sched = build_method(cfg, 200).schedule
    assert cfg.trainer.epochs == 200 and sched.horizon == 200  # horizon null: the schedule spans the run
    assert sched(0) == sched(100) == 0.1            # constant for the first half
    assert sched(180) == pytest.approx(0.001)       # 0.01 x lr after 90%
    assert sched(140) == pytest.approx(0.1 * (1 - 0.99 * 0.5))  # halfway down the linear decay


def test_budgets_round_to_whole_epochs():
    assert epochs_of_budget(1.25, 150) == 188 and epochs_of_budget(1.5, 200) == 300


def test_resolved_config_has_no_missing_values(make_cfg):
    cfg = make_cfg("method=swa", "model=preresnet164", "dataset=cifar10")
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert resolved["trainer"]["epochs"] == 225


def test_a_training_method_refuses_a_budget_of_zero(make_cfg):
    """``method.budget=0 trainer.epochs=2`` used to train and report a column "SGD 0B (2 ep)"."""
    with pytest.raises(ConfigError, match=r"method.budget=0 must be > 0 for method=sgd"):
        validate(make_cfg("method=sgd", "method.budget=0", "trainer.epochs=2"))


@pytest.mark.parametrize("model, dataset", [("wrn28_10", "cifar100"), ("vgg16", "cifar100"), ("preresnet164", "cifar100"),
                                            ("pyramidnet272", "cifar100"), ("shakeshake26_2x64d", "cifar10"),
                                            ("resnet50", "imagenet"), ("preresnet20", "digits")])
def test_a_paper_model_trains_on_its_paper_data_set_unless_another_is_named(make_cfg, model, dataset):
    assert make_cfg(f"model={model}").dataset.name == dataset  # `run.py method=swa model=wrn28_10` as in the paper
    assert make_cfg(f"model={model}", "dataset=digits").dataset.name == "digits"  # a dataset= typed wins
    assert make_cfg("dataset=cifar10", f"model={model}").dataset.name == "cifar10"  # in either order


@pytest.mark.parametrize("group, key, schema", [("trainer", "eval_batch_size", "TrainerSettings"),
                                                ("run", "epochs", "RunSettings")])
def test_a_key_a_config_file_adds_to_the_trainer_or_run_group_is_refused_while_composing(tmp_path, group, key, schema):
    """An experiment's yaml may not add a key to a group that its settings class (swalab.settings) does not define:
    nothing would read it (the table2 experiments once set trainer.eval_batch_size after it had moved to run)."""
    import shutil

    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    shutil.copytree(CONF_DIR, tmp_path / "conf")
    (tmp_path / "conf" / "experiment" / "stray.yaml").write_text(f"# @package _global_\n{group}:\n  {key}: 3\n")
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base="1.3"):
        compose(config_name="config", overrides=["experiment=table2_resnet50"])  # every shipped one sets known keys
        with pytest.raises(ConfigCompositionException, match=rf"Key '{key}' not in '{schema}'"):
            compose(config_name="config", overrides=["experiment=stray"])


def test_the_docs_write_no_key_of_an_earlier_version():
    """A command copied from the docs runs: none of its ``key=value`` uses a key that moved (swalab refuses it)."""
    import re

    from swalab.compat import MOVED_KEYS, RESPELLED

    root = CONF_DIR.parent
    written = re.compile(r"(?<![\w./])\+{0,2}([a-z_]+(?:\.[a-z_0-9]+)+)=")
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    old = [f"{path.relative_to(root)}:{n}: {key}" for path in docs
           for n, line in enumerate(path.read_text().splitlines(), 1) for key in written.findall(line)
           if key in MOVED_KEYS or key in RESPELLED]
    assert old == []
