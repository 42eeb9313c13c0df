"""``swalab.identity``'s rules, each on a small hand-made identity or config: which keys of a config count and with
what values, the identities of earlier versions read under today's names (``RENAMED``, ``RESPELLED``,
``RECIPE_BLOCKS``, ``ADDED_AT``), what only the method decides, the canonical
text and hash of an identity, a settings-apart label, and the identity stored in a run directory. Each test was
written for a mutant of ``src/swalab/identity.py`` that no other test caught (found by mutation testing, see
docs/mutation.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from swalab.compat import upgraded, upgraded_config
from swalab.identity import (
    canonical, group_hash, identity_hash, identity_of, label_of, method_part, stored_identity,
)

# What ``upgraded`` adds to an identity that lacks them (``ADDED_AT``): what every run did before the key existed.
# Written out rather than imported, so that a changed or added value in ``ADDED_AT`` fails here on purpose.
EARLIER_DEFAULTS = {
    "optimizer._target_": "torch.optim.SGD", "optimizer.filter_bias_and_bn": False,
    "loss.label_smoothing": 0.0, "loss.mixup_alpha": 0.0, "loss.cutmix_alpha": 0.0, "loss.mix_prob": 1.0,
    "loss.switch_prob": 0.5, "loss.mix_mode": "batch",
    "schedule.warmup_epochs": 0.0,
    "trainer.clip_grad_norm": None, "trainer.accumulate": 1, "trainer.precision": "auto",
}


# -- identity_of: which keys count, with what values ---------------------------------------------------------------

def test_an_empty_block_of_a_config_is_held_in_the_identity_as_an_empty_block():
    resolved = {"trainer": {"epochs": 6, "extra": {}}, "run": {"device": "cpu"}}
    assert identity_of(resolved) == {"trainer.epochs": 6, "trainer.extra": {}}


def test_a_block_with_keys_is_held_as_its_keys_only():
    assert identity_of({"model": {"depth": 16, "width": 4}}) == {"model.depth": 16, "model.width": 4}


def test_a_list_value_is_held_whole_with_its_items():
    resolved = {"schedule": {"milestones": [3, 5]}, "trainer": {"epochs": 6}}
    assert identity_of(resolved) == {"schedule.milestones": [3, 5], "trainer.epochs": 6}


def test_a_list_of_blocks_and_lists_is_held_with_every_key_and_value():
    resolved = {"dataset": {"transforms": [{"name": "crop", "size": 32}, ["flip", 0.5], ("x", 1)]}}
    assert identity_of(resolved) == {
        "dataset.transforms": [{"name": "crop", "size": 32}, ["flip", 0.5], ["x", 1]],
    }


def test_a_block_inside_a_list_is_held_with_its_keys_as_text():
    resolved = {"loss": {"weights": [{1: 0.5, 2: {3: 0.25}}]}}
    assert identity_of(resolved) == {"loss.weights": [{"1": 0.5, "2": {"3": 0.25}}]}


def test_the_data_fingerprint_is_held_when_known_and_absent_when_not():
    resolved = {"dataset": {"name": "cifar10", "root": "/data/cifar"}}
    assert identity_of(resolved, data_fingerprint="ab12cd") == {
        "data.fingerprint": "ab12cd", "dataset.name": "cifar10",
    }
    assert identity_of(resolved) == {"dataset.name": "cifar10"}


def test_a_validation_split_counts_only_away_from_none_and_zero():
    def held(val_size):
        return identity_of({"dataset": {"name": "cifar10", "val_size": val_size}})

    assert held(None) == {"dataset.name": "cifar10"}
    assert held(0) == {"dataset.name": "cifar10"}
    assert held(0.0) == {"dataset.name": "cifar10"}
    assert held(5000) == {"dataset.name": "cifar10", "dataset.val_size": 5000}
    assert held(0.1) == {"dataset.name": "cifar10", "dataset.val_size": 0.1}


def test_a_validation_split_of_false_counts_though_false_equals_zero():
    assert identity_of({"dataset": {"val_size": False}}) == {"dataset.val_size": False}


# -- upgraded: identities of earlier versions under today's names ---------------------------------------------------

def test_todays_identity_comes_back_unchanged():
    today = {**EARLIER_DEFAULTS, "seed": 0, "method.name": "swa", "method.lr": 0.05, "trainer.accumulate": 4,
             "trainer.precision": "bf16", "model.init_from": "/runs/a"}
    assert upgraded(today) == today
    assert list(upgraded(today)) == sorted(today)


def test_an_empty_identity_stays_empty():
    assert upgraded({}) == {}


def test_an_identity_of_an_earlier_version_gets_every_key_added_since_at_the_value_it_ran_with():
    assert upgraded({"seed": 0, "trainer.epochs": 6}) == {**EARLIER_DEFAULTS, "seed": 0, "trainer.epochs": 6}


def test_an_added_key_an_identity_holds_keeps_its_own_value():
    upgraded_identity = upgraded({"seed": 0, "trainer.accumulate": 4, "loss.label_smoothing": 0.1})
    assert upgraded_identity["trainer.accumulate"] == 4
    assert upgraded_identity["loss.label_smoothing"] == 0.1
    assert upgraded_identity["trainer.clip_grad_norm"] is None


def test_an_identity_of_an_earlier_version_reads_its_renamed_keys_under_todays_names():
    old = {"seed": 0, "run.init_from": "/runs/a", "trainer.momentum": 0.9, "trainer.weight_decay": 5e-4,
           "trainer.nesterov": True}
    assert upgraded(old) == {**EARLIER_DEFAULTS, "seed": 0, "model.init_from": "/runs/a", "optimizer.momentum": 0.9,
                             "optimizer.weight_decay": 5e-4, "optimizer.nesterov": True}


def test_an_identity_of_an_earlier_version_reads_amp_as_todays_precision():
    assert upgraded({"seed": 0, "trainer.amp": False}) == {**EARLIER_DEFAULTS, "seed": 0, "trainer.precision": "fp32"}
    assert upgraded({"seed": 0, "trainer.amp": True}) == {**EARLIER_DEFAULTS, "seed": 0, "trainer.precision": "auto"}


def test_an_amp_value_that_was_never_a_precision_reads_as_unknown():
    assert upgraded({"seed": 0, "trainer.amp": None})["trainer.precision"] == "<unknown>"
    assert "trainer.amp" not in upgraded({"seed": 0, "trainer.amp": None})


def test_an_identity_of_version_1_reads_swas_prefixed_settings_under_their_names_today():
    old = {"seed": 0, "method.name": "swa", "method.swa_lr": 0.05, "method.swa_start": 0.75,
           "method.cycle_epochs": 1, "model.lr": 0.1}
    assert upgraded(old) == {**EARLIER_DEFAULTS, "seed": 0, "method.name": "swa", "method.lr": 0.05,
                             "method.start": 0.75, "method.cycle_epochs": 1, "model.lr": 0.1}


def test_an_identity_of_version_1_holds_fges_settings_where_they_are_today():
    old = {"seed": 1, "method.name": "fge", "method.lr_max": 0.05, "method.save_members": False}
    assert upgraded(old) == {**EARLIER_DEFAULTS, **old}


def test_method_settings_of_a_method_without_a_recipe_block_stay_where_they_are():
    old = {"seed": 0, "method.name": "ema", "method.decay": 0.999, "model.lr": 0.1}
    assert upgraded(old) == {**EARLIER_DEFAULTS, **old}


def test_a_swag_identity_made_before_diag_scale_existed_reads_the_scale_its_swag_diag_was_sampled_at():
    """Until method.diag_scale existed, swag_diag was sampled at method.scale: such a run is read as holding that
    value, so it is another run than today's default (diag_scale 1.0, the authors' SWAG-diagonal)."""
    old = {"seed": 0, "method.name": "swag", "method.scale": 0.5}
    assert upgraded(old)["method.diag_scale"] == 0.5
    assert upgraded({**old, "method.diag_scale": 1.0})["method.diag_scale"] == 1.0
    assert "method.diag_scale" not in upgraded({"seed": 0, "method.name": "swa", "method.scale": 0.5})


def test_a_swag_config_made_before_diag_scale_existed_is_rebuilt_sampling_swag_diag_at_its_scale():
    old = {"method": {"name": "swag", "scale": 0.25}, "trainer": {"epochs": 6}}
    assert upgraded_config(old)["method"]["diag_scale"] == 0.25
    assert "diag_scale" not in upgraded_config({"method": {"name": "swa"}, "trainer": {"epochs": 6}})["method"]


def test_an_identity_of_an_earlier_version_compares_equal_to_todays_of_the_same_config():
    old = {"seed": 0, "method.name": "swa", "method.swa_lr": 0.05, "trainer.amp": True, "trainer.momentum": 0.9}
    today = {**EARLIER_DEFAULTS, "seed": 0, "method.name": "swa", "method.lr": 0.05, "optimizer.momentum": 0.9}
    assert upgraded(old) == upgraded(today)
    assert group_hash(upgraded(old)) == group_hash(today)


# -- method_part: what only the method decides; the recipe blocks of identity versions 2 to 5 ---------------------

def test_an_identity_of_versions_2_to_5_holds_swas_and_fges_settings_as_their_method_keys_today():
    swa = {"seed": 0, "method.name": "swa", "model.swa.lr": 0.05, "model.swa.start": 0.5, "model.lr": 0.1}
    fge = {"seed": 0, "method.name": "fge", "model.fge.lr_max": 0.05, "model.fge.save_members": True}
    assert {k: v for k, v in upgraded(swa).items() if k.startswith(("method.", "model."))} == {
        "method.name": "swa", "method.lr": 0.05, "method.start": 0.5, "model.lr": 0.1}
    assert {k: v for k, v in upgraded(fge).items() if k.startswith(("method.", "model."))} == {
        "method.name": "fge", "method.lr_max": 0.05, "method.save_members": True}


def test_the_schedules_horizon_and_the_methods_keys_are_what_only_the_method_decides():
    assert method_part("schedule.horizon") is True
    assert method_part("method.lr") is True
    assert method_part("schedule.lr") is False


def test_a_recipe_blocks_key_is_the_methods_but_no_other_model_key_is():
    assert method_part("model.swa.lr") is True  # as a settings-apart record names method.lr
    assert method_part("model.fge.lr_max") is True
    assert method_part("model.swa") is True
    assert method_part("model.swap.lr") is False
    assert method_part("model.lr") is False


# -- canonical text and hashes -------------------------------------------------------------------------------------

def test_the_canonical_text_of_an_identity_is_compact_json_with_sorted_keys():
    identity = {"trainer.milestones": [3, 5], "seed": 0, "trainer.epochs": 6}
    assert canonical(identity) == '{"seed":0,"trainer.epochs":6,"trainer.milestones":[3,5]}'


def test_a_value_json_cannot_hold_is_written_as_its_text():
    assert canonical({"model.init_from": Path("/runs/a")}) == '{"model.init_from":"/runs/a"}'


def test_an_identitys_hash_is_the_first_twelve_hex_digits_of_the_sha256_of_its_canonical_text():
    identity = {"trainer.milestones": [3, 5], "seed": 0, "trainer.epochs": 6}
    text = '{"seed":0,"trainer.epochs":6,"trainer.milestones":[3,5]}'
    assert identity_hash(identity) == hashlib.sha256(text.encode()).hexdigest()[:12] == "b27fdf853de2"
    assert group_hash(identity) == hashlib.sha256(b'{"trainer.epochs":6,"trainer.milestones":[3,5]}').hexdigest()[:12]


# -- label_of ------------------------------------------------------------------------------------------------------

def test_a_label_names_each_setting_apart_separated_by_commas():
    apart = {"schedule": "cosine", "model.swa.lr": 0.05, "trainer.epochs": 6}
    assert label_of(apart) == "schedule=cosine, model.swa.lr=0.05, trainer.epochs=6"


def test_a_label_of_some_keys_names_those_keys_only():
    apart = {"schedule": "cosine", "model.swa.lr": 0.05, "trainer.epochs": 6}
    assert label_of(apart, keys=["model.swa.lr", "trainer.epochs"]) == "model.swa.lr=0.05, trainer.epochs=6"
    assert label_of(apart, keys=[]) == ""


# -- stored_identity -----------------------------------------------------------------------------------------------

def test_the_stored_identity_of_a_run_is_its_identity_json_under_todays_names(tmp_path):
    stored = {"seed": 0, "method.name": "swa", "method.swa_lr": 0.05, "trainer.amp": False}
    (tmp_path / "identity.json").write_text(json.dumps({"version": 1, "hash": "x", "identity": stored}))
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 0, "method.name": "swa", "method.lr": 0.05,
                                         "trainer.precision": "fp32"}


def test_identity_json_comes_before_the_config_it_was_made_from(tmp_path):
    (tmp_path / "identity.json").write_text(json.dumps({"identity": {"seed": 3}}))
    (tmp_path / "config.yaml").write_text("seed: 4\n")
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 3}


def test_a_run_without_identity_json_has_the_identity_of_its_config_yaml(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "seed: 2\ntrainer:\n  epochs: 6\n  accumulate: 2\nrun:\n  device: cpu\ndataset:\n  root: /data/cifar\n")
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 2, "trainer.epochs": 6, "trainer.accumulate": 2}


def test_an_unreadable_identity_json_falls_back_to_config_yaml(tmp_path):
    (tmp_path / "identity.json").write_text("{not json")
    (tmp_path / "config.yaml").write_text("seed: 5\n")
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 5}


def test_a_run_directory_with_neither_file_or_an_empty_config_has_no_or_an_empty_identity(tmp_path):
    assert stored_identity(tmp_path) is None
    (tmp_path / "config.yaml").write_text("")
    assert stored_identity(tmp_path) == {}


def test_an_identity_json_or_config_yaml_that_holds_no_mapping_counts_as_absent(tmp_path):
    """A damaged or hand-edited file that parses but holds no mapping never stops a report or a plan."""
    (tmp_path / "identity.json").write_text(json.dumps({"identity": None}))
    (tmp_path / "config.yaml").write_text("seed: 5\n")
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 5}
    (tmp_path / "identity.json").write_text(json.dumps([1, 2]))
    assert stored_identity(tmp_path) == {**EARLIER_DEFAULTS, "seed": 5}
    (tmp_path / "config.yaml").write_text("- 1\n")
    assert stored_identity(tmp_path) is None
