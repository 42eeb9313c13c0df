"""Every setting of every method is checked once, where the method is built, against its exact bound, and the
refusal names the method's key (``method.lr``, ``method.decay``; a run names the recipe block's key a value came from,
``model.swa.lr``, tests/test_run_identity.py). A method built in Python with only its
required arguments is the one the default config builds, and what the constructor derives from the settings (the
start epoch, the pre-averaging schedule, the name) is what a run uses.

The bounds here are written out from the config comments (conf/recipe/paper.yaml, conf/method/*.yaml), not read
from the code: each case is "the last value accepted" and "the first value refused, with this message".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from swalab.config import ConfigError
from swalab.methods import EMA, FGE, SWA, SWAG, Method, TrainContext
from swalab.methods.pretrained import Pretrained
from swalab.schedules import Constant, PaperSGD

CONF = Path(__file__).resolve().parents[1] / "conf"
BASE = PaperSGD(lr=0.1, horizon=20)


def build(method: str, **settings):
    """``method`` built with valid required arguments, ``settings`` overriding them."""
    if method == "method":
        return Method(BASE, **{"epochs": 10, **settings})
    if method == "swa":
        return SWA(BASE, **{"epochs": 20, "lr": 0.01, "start": 0.5, **settings})
    if method == "swag":
        return SWAG(BASE, **{"epochs": 20, "lr": 0.01, "start": 0.5, **settings})
    if method == "fge":
        return FGE(BASE, **{"epochs": 20, "lr_max": 0.05, "lr_min": 0.01, "pretrain": 0.5, **settings})
    if method == "ema":
        return EMA(BASE, **{"epochs": 20, **settings})
    raise AssertionError(method)


# ------------------------------------------------------------------------- bounds: first refused value, its message

REFUSED = [
    ("method", "epochs", -1, "trainer.epochs=-1 must be >= 0"),
    ("method", "epochs", 2.5, "trainer.epochs=2.5 must be an integer"),
    ("method", "budget", -0.5, "method.budget=-0.5 must be >= 0"),
    ("swa", "start", -0.1, "method.start=-0.1 must be >= 0"),
    ("swa", "start", "late", "method.start='late' must be a finite number or null"),
    ("swa", "start_epoch", -1, "method.start_epoch=-1 must be >= 0"),
    ("swa", "lr", 0, "method.lr=0 must be > 0"),
    ("swa", "lr_min", 0, "method.lr_min=0 must be > 0"),
    ("swa", "cycle_epochs", 0, "method.cycle_epochs=0 must be > 0"),
    ("swa", "capture_every", 0, "method.capture_every=0 must be >= 1"),
    ("swa", "anneal_epochs", -1, "method.anneal_epochs=-1 must be >= 0"),
    ("swa", "score_every", -1, "method.score_every=-1 must be >= 0"),
    ("swa", "score_at_budgets", [1.0, 0], "method.score_at_budgets[]=0 must be > 0"),
    ("swag", "lr", 0, "method.lr=0 must be > 0"),  # SWAG trains as SWA does: SWA's settings, SWA's keys
    ("swag", "rank", 1, "method.rank=1 must be >= 2"),
    ("swag", "samples", 0, "method.samples=0 must be >= 1"),
    ("swag", "scale", -0.5, "method.scale=-0.5 must be >= 0"),
    ("fge", "lr_max", 0, "method.lr_max=0 must be > 0"),
    ("fge", "lr_min", 0, "method.lr_min=0 must be > 0"),
    ("fge", "cycle_epochs", 1, "method.cycle_epochs=1 must be >= 2"),
    ("fge", "pretrain", -0.1, "method.pretrain=-0.1 must be >= 0"),
    ("fge", "pretrain_epochs", -1, "method.pretrain_epochs=-1 must be >= 0"),
    ("ema", "decay", 0, "method.decay=0 must be in (0, 1)"),
    ("ema", "decay", 1, "method.decay=1 must be in (0, 1)"),
    ("ema", "warmup", "yes", "method.warmup='yes' must be true or false"),
    ("ema", "warmup_gamma", 0, "method.warmup_gamma=0 must be > 0"),
    ("ema", "warmup_power", 0, "method.warmup_power=0 must be > 0"),
    ("ema", "update_every", 0, "method.update_every=0 must be >= 1"),
    ("ema", "avg_device", "gpu", "run.avg_device='gpu' must be 'train' (the training device) or 'cpu'"),
    ("swa", "avg_device", "gpu", "run.avg_device='gpu' must be 'train' (the training device) or 'cpu'"),
]


@pytest.mark.parametrize("method, setting, value, message", REFUSED, ids=[f"{m}.{s}={v}" for m, s, v, _ in REFUSED])
def test_a_setting_past_its_bound_is_refused_when_the_method_is_built_naming_its_key(method, setting, value, message):
    with pytest.raises(ConfigError) as refused:
        build(method, **{setting: value})
    assert str(refused.value) == message


# ------------------------------------------------------------------------- bounds: the last accepted value is kept

ACCEPTED = [
    ("method", "epochs", 0), ("method", "budget", 0),
    ("swa", "start", 0), ("swa", "start_epoch", 0), ("swa", "lr", 1e-6), ("swa", "lr_min", 1e-6),
    ("swa", "cycle_epochs", 0.25), ("swa", "capture_every", 1), ("swa", "anneal_epochs", 0), ("swa", "score_every", 0),
    ("swag", "rank", 2), ("swag", "samples", 1), ("swag", "scale", 0.0),
    ("fge", "lr_max", 1e-6), ("fge", "lr_min", 1e-6), ("fge", "cycle_epochs", 2), ("fge", "pretrain_epochs", 0),
    ("ema", "decay", 1e-6), ("ema", "decay", 1 - 1e-9), ("ema", "warmup_gamma", 1e-6), ("ema", "warmup_power", 1e-6),
    ("ema", "update_every", 1),
]


@pytest.mark.parametrize("method, setting, value", ACCEPTED, ids=[f"{m}.{s}={v}" for m, s, v in ACCEPTED])
def test_a_setting_at_its_bound_is_accepted_and_kept(method, setting, value):
    assert getattr(build(method, **{setting: value}), setting) == value


def test_score_at_budgets_accepts_any_positive_marks_and_keeps_them_as_floats():
    assert build("swa", score_at_budgets=[1, 1.25]).score_at_budgets == [1.0, 1.25]
    assert build("swa", score_at_budgets=None).score_at_budgets == []


def test_swa_without_a_start_says_both_ways_to_give_one():
    with pytest.raises(ConfigError) as refused:
        SWA(BASE, 20, lr=0.01)
    assert str(refused.value) == ("SWA needs a start: set method.start (a fraction of the budget B) or "
                                  "method.start_epoch (an exact epoch)")


# ------------------------------------------------------------------------- defaults: the Python API is the config

# The run's length and name (the method's group config and trainer.epochs) and the start of averaging or of the
# cycles, which each model's yaml sets and the constructor requires in one of two forms, are not defaults.
NOT_DEFAULTS = ("budget", "name", "start", "start_epoch", "pretrain", "pretrain_epochs")


def yaml_block(path: str, block: str | None = None) -> dict:
    config = OmegaConf.to_container(OmegaConf.load(CONF / path))
    config = config[block] if block else config
    return {k: v for k, v in config.items() if k not in NOT_DEFAULTS and not k.startswith("_") and k != "defaults"
            and not (isinstance(v, str) and v.startswith("${"))}  # SWA's keys in swag.yaml read model.swa


def settings_of(method) -> dict:
    """The method's settings and derived values as plain data (models and tensors left out)."""
    plain = (str, int, float, bool, list, type(None), PaperSGD, Constant)
    return {k: v for k, v in vars(method).items() if isinstance(v, plain)}


@pytest.mark.parametrize("method, path, block", [
    ("swa", "recipe/paper.yaml", "swa"),
    ("fge", "recipe/paper.yaml", "fge"),
    ("ema", "method/ema.yaml", None),
    ("swag", "method/swag.yaml", None),
])
def test_a_method_built_in_python_from_its_required_arguments_is_the_one_the_default_config_builds(method, path, block):
    """``SWA(schedule, epochs, lr=..., start=...)`` in a notebook trains what ``method=swa`` trains: every default
    of the constructor is the value the config sets (conf/recipe/paper.yaml, conf/method/*.yaml)."""
    config = yaml_block(path, block)
    from_python, from_config = build(method), build(method, **config)
    assert settings_of(from_python) == settings_of(from_config)
    assert len(settings_of(from_python)) >= len(config)


@pytest.mark.parametrize("method", ["method", "swa", "swag", "fge", "ema"])
def test_a_method_built_without_a_budget_takes_its_run_as_one_budget(method):
    assert build(method).budget_epochs == build(method).epochs
    assert build(method, budget=2.0).budget_epochs == build(method).epochs / 2
    assert build("swa").start_epoch == 10  # half of B = 20


def test_run_avg_device_defaults_to_the_training_device():
    assert build("swa").avg_device == build("ema").avg_device == "train"


@pytest.mark.parametrize("method", ["method", "swa", "swag", "fge", "ema"])
def test_a_method_is_called_by_its_own_name_unless_the_config_names_it(method):
    assert build(method).name == {"method": "method"}.get(method, method)
    assert build(method, name="mine").name == "mine"


def test_pretrained_trains_nothing_whatever_the_run_length_and_counts_no_budget():
    method = Pretrained(BASE, epochs=30, budget=1.5, name="pre")
    assert (method.epochs, method.name) == (0, "pre")
    assert Pretrained().describe("pretrained") == {"budget": 0.0, "epoch": 0}
    assert Pretrained().name == "pretrained"


# ------------------------------------------------------------------------- what the constructor derives


def test_an_exact_start_epoch_wins_over_a_fraction_and_the_refusal_then_names_it():
    swa = build("swa", start=0.5, start_epoch=3)
    assert swa.start_epoch == 3
    late = build("swa", start=0.2, start_epoch=25)
    with pytest.raises(ConfigError, match=r"SWA would start averaging at epoch 25 \(method\.start_epoch\)"):
        late.validate(initialized=False)
    fraction = build("swa", start=1.5)  # 30 of B = 20, past trainer.epochs=20
    with pytest.raises(ConfigError, match=r"epoch 30 \(method\.start=1\.5 of B=20\)"):
        fraction.validate(initialized=False)


@pytest.mark.parametrize("epoch, expected", [(0, 0.1), (5, 0.1), (7, 0.055), (8, 0.0325), (9, 0.01)])
def test_swas_reference_pre_schedule_is_the_papers_shape_over_the_start_epochs_ending_at_the_swa_lr(epoch, expected):
    """start_epoch = 10, lr 0.1 -> 0.01: flat to 5, linear to 9, then the SWA lr (the reference code's schedule)."""
    swa = SWA(BASE, 20, lr=0.01, start_epoch=10, pre_schedule="reference")
    assert swa.lr_at(epoch, 0, 4) == pytest.approx(expected)
    assert SWA(BASE, 20, lr=0.01, start_epoch=10, pre_schedule="base").lr_at(epoch, 0, 4) == BASE.at(epoch, 0, 4)


@pytest.mark.parametrize("epoch, expected", [(0, 0.1), (4, 0.1), (6, 0.038125), (7, 0.0071875)])
def test_fges_reference_pre_schedule_is_the_papers_shape_over_the_pretraining(epoch, expected):
    """pretrain_epochs = 8, lr 0.1: flat to epoch 4, then linear towards 1% of the lr at 7.2 (the paper's SGD over the
    8 epochs): 0.1 x (1 - 0.99 x (6/8 - 0.5) / 0.4) at epoch 6."""
    fge = build("fge", pretrain=None, pretrain_epochs=8, pre_schedule="reference")
    assert fge.lr_at(epoch, 0, 4) == pytest.approx(expected)
    assert build("fge", pretrain=None, pretrain_epochs=8, pre_schedule="base").lr_at(epoch, 0, 4) == BASE.at(epoch, 0, 4)


@pytest.mark.parametrize("settings, pretrain_epochs", [
    ({"pretrain": None}, 0), ({"pretrain": 0.5}, 10), ({"pretrain": 0.5, "pretrain_epochs": 3}, 3),
    ({"pretrain": None, "pretrain_epochs": 0}, 0),
])
def test_fge_pretrains_for_the_exact_epochs_or_the_fraction_of_b_or_not_at_all(settings, pretrain_epochs):
    fge = build("fge", **settings)
    assert fge.pretrain_epochs == pretrain_epochs
    assert fge.lr_at(pretrain_epochs, 0, 4) == 0.05  # the first cycle starts at lr_max


def test_a_method_holds_no_model_before_training_starts():
    swa, ema, fge = build("swa"), build("ema"), build("fge")
    assert swa.n_averaged == 0 and swa.final_weights() == {} and swa.state_dict()["averaged"] is None
    assert ema.final_weights() == {} and ema.state_dict() == {"ema": None, "updates": 0}
    assert fge.state_dict() == {"member_files": [], "member_epochs": []}


def test_fge_names_each_members_validation_predictions_in_its_state(tmp_path):
    fge = build("fge", pretrain=None, cycle_epochs=2)
    ctx = TrainContext(model=nn.Linear(2, 3), device=torch.device("cpu"), epochs=4, steps_per_epoch=1,
                       run_dir=tmp_path, update_bn=lambda m: None, test_log_probs=lambda m: torch.zeros(2, 3),
                       test_labels=torch.zeros(2, dtype=torch.long), val_log_probs=lambda m: torch.ones(1, 3))
    for epoch in range(4):
        fge.on_epoch_end(ctx, epoch)
    assert fge.state_dict() == {"member_files": ["fge_member_001", "fge_member_002"], "member_epochs": [0, 2],
                                "member_val_files": ["fge_member_001_val", "fge_member_002_val"]}
