"""``swalab.identity``: how two identities are told apart, what sets a run apart from its defaults, and the run
directory name made from it, on small hand-made identities. Most of these came from mutation testing of the module
(docs/mutation.md): each fails on an edit of the rule it names."""

from __future__ import annotations

from swalab.config import split_override
from swalab.identity import (IDENTITY_VERSION, MAX_REST, differences, group_hash, identity_hash, label_of,
                             name_items, record, run_name, settings_apart)

NAMES = {"dataset": "cifar10", "model": "preresnet20", "method": "swa"}


def test_a_key_only_one_side_holds_is_a_difference_named_absent_on_the_other():
    assert differences({"a": 1, "b": 2}, {"a": 1}) == ["b: '<absent>' there, 2 here"]
    assert differences({"a": 1}, {"a": 1, "c": None}) == ["c: None there, '<absent>' here"]


def test_ignored_groups_are_skipped_and_the_keys_after_them_still_compared():
    assert differences({"logger.x": 1, "model.lr": 0.1}, {"logger.x": 2, "model.lr": 0.2}, ignore=("logger",)) == [
        "model.lr: 0.2 there, 0.1 here"]


def test_an_identity_of_an_earlier_swalab_is_not_held_to_the_keys_it_kept_or_lacked():
    """An earlier swalab recorded a data folder's path (``dataset.root``) and no data fingerprint: neither is a
    difference, but every other key either side lacks still is."""
    earlier = {"dataset.root": "/data/cifar10", "model.lr": 0.1, "trainer.batch_size": 128}
    today = {"data.fingerprint": "abc", "model.lr": 0.2, "trainer.epochs": 6}
    assert differences(today, earlier) == ["model.lr: 0.1 there, 0.2 here",
                                           "trainer.batch_size: 128 there, '<absent>' here",
                                           "trainer.epochs: '<absent>' there, 6 here"]
    # the other way round, today's fingerprint is what the earlier run lacks, and its root what today's lacks
    assert differences(earlier, today)[0] == "data.fingerprint: 'abc' there, '<absent>' here"
    assert "dataset.root: '<absent>' there, '/data/cifar10' here" in differences(earlier, today)


def test_what_sets_a_run_apart_includes_keys_either_side_lacks_and_never_the_seed_or_the_data():
    identity = {"seed": 3, "data.fingerprint": "x", "model.lr": 0.1, "trainer.note": None, "loss.extra": 1}
    default = {"seed": 0, "data.fingerprint": "y", "model.lr": 0.05, "trainer.clip": None}
    assert settings_apart(identity, default, {}) == {"loss.extra": 1, "model.lr": 0.1, "trainer.clip": "<absent>",
                                                     "trainer.note": None}


def test_a_setting_read_through_an_interpolation_is_named_by_the_key_a_user_types():
    assert settings_apart({"schedule.lr": 0.1}, {"schedule.lr": 0.05}, {"schedule.lr": "model.lr"}) == {
        "model.lr": 0.1}


def test_a_list_setting_is_labelled_in_brackets_and_named_by_its_items():
    assert label_of({"model.swa.score_at_budgets": [1, 1.25], "schedule": "cosine"}) == (
        "model.swa.score_at_budgets=[1,1.25], schedule=cosine")
    assert name_items({"model.swa.score_at_budgets": [1, 1.25], "loss.weights": []}) == (
        ["swa.score_at_budgets-1_1.25", "loss.weights-empty"], True)


def test_a_setting_of_a_block_of_the_models_is_named_without_model_and_every_other_key_whole():
    """``model.swa.pre_schedule-base+model.swa.score_every-1`` was the issue's name; today ``swa.pre_schedule-base+
    swa.score_every-1``. A block of the model's named like a config group keeps its whole key (no two keys share a
    name), and the names of identity version 2 are the whole keys (``compat.SHORT_NAMES_SINCE``)."""
    apart = {"model.swa.pre_schedule": "base", "model.swa.score_every": 1, "model.arch.depth": 8, "model.lr": 0.1,
             "model.trainer.x": 1, "trainer.epochs": 6}
    assert name_items(apart)[0] == ["swa.pre_schedule-base", "swa.score_every-1", "arch.depth-8", "model.lr-0.1",
                                    "model.trainer.x-1", "trainer.epochs-6"]
    assert name_items(apart, version=2)[0][:3] == ["model.swa.pre_schedule-base", "model.swa.score_every-1",
                                                   "model.arch.depth-8"]
    assert run_name(NAMES, 0, {"model.swa.lr": 0.05}, {}, "0123456789ab", version=2) == (
        "cifar10/preresnet20/swa/model.swa.lr-0.05/seed0")


def test_a_value_a_directory_name_cannot_hold_is_replaced_and_the_name_marked_inexact_whatever_follows():
    assert name_items({"model.note": "a b", "trainer.epochs": 6}) == (["model.note-a_b", "trainer.epochs-6"], False)


def test_an_override_splits_into_its_prefix_key_and_value():
    assert split_override("model.lr=0.1") == ("", "model.lr", "0.1")
    assert split_override("++trainer.x= 2") == ("++", "trainer.x", " 2")
    assert split_override("~trainer.x") is None


def test_the_record_holds_the_hashes_of_its_identity_and_what_sets_it_apart_when_known():
    identity = {"seed": 1, "model.lr": 0.1}
    assert record(identity, {"model.lr": 0.1}) == {"version": IDENTITY_VERSION, "hash": identity_hash(identity),
                                                   "group": group_hash(identity), "identity": identity,
                                                   "apart": {"model.lr": 0.1}}
    assert identity_hash(identity) != identity_hash({}) and group_hash(identity) == group_hash({"model.lr": 0.1})
    assert "apart" not in record(identity)


def test_an_experiment_and_a_sweep_head_the_run_directory_and_null_ones_do_not():
    apart = {"schedule": "cosine", "trainer.epochs": 6}
    assert run_name(NAMES, 0, apart, {"experiment": "table1", "sweep": "lr"}, "0123456789ab") == (
        "table1/lr/cifar10/preresnet20/swa/schedule-cosine+trainer.epochs-6/seed0")
    assert run_name(NAMES, 1, {}, {"experiment": "null", "sweep": ""}, "0123456789ab") == (
        "cifar10/preresnet20/swa/default/seed1")


def long_apart(lengths):
    """Settings whose name items (``kN-xxx``) have exactly the given lengths."""
    return {f"k{i}": "x" * (n - len(f"k{i}-")) for i, n in enumerate(lengths)}


def test_a_name_of_exactly_the_limit_is_kept_whole():
    apart = long_apart([50, 49])  # 50 + "+" + 49 = 100 characters
    assert len("+".join(name_items(apart)[0])) == MAX_REST
    assert run_name(NAMES, 0, apart, {}, "0123456789ab").split("/")[3] == "+".join(name_items(apart)[0])


def test_a_longer_name_keeps_the_items_that_fit_in_88_characters_then_the_group_hash():
    apart = long_apart([44, 43, 30])  # the first two make 88 characters, the third would not fit
    items = name_items(apart)[0]
    assert run_name(NAMES, 0, apart, {}, "0123456789ab").split("/")[3] == f"{items[0]}+{items[1]}+id-01234567"
    apart = long_apart([44, 44, 30])  # 89 characters: only the first fits
    items = name_items(apart)[0]
    assert run_name(NAMES, 0, apart, {}, "0123456789ab").split("/")[3] == f"{items[0]}+id-01234567"


def test_an_inexact_name_keeps_its_items_and_adds_the_group_hash_so_two_configs_never_share_it():
    assert run_name(NAMES, 0, {"model.note": "a b"}, {}, "0123456789ab").split("/")[3] == "model.note-a_b+id-01234567"
    assert run_name(NAMES, 0, None, {}, "0123456789ab").split("/")[3] == "default+id-01234567"
