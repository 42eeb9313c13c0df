"""``python -m swalab.results.score`` on a SWAG run: its samples drawn again from the moments in the kept checkpoint
of its last epoch (``swalab.results.rebuilt``), so that ``swag`` and ``swag_diag`` stand beside SWA and SGD on
other test sets; a run that kept no such checkpoint says how to keep one."""

from __future__ import annotations

import json

import pytest

from swalab.results.score import main

TINY = ["dataset.train_size=96", "dataset.val_size=48", "trainer.batch_size=32", "run.eval_every=0", "trainer.epochs=4",
        "method=swag", "model.swa.start_epoch=1", "method.rank=2", "method.samples=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny SWAG runs: one that kept its finished checkpoints, one at scale 0 (every sample is the SWA average)
    that kept them too, and one that kept none (the default)."""
    from conftest import train_on_one_thread

    root = tmp_path_factory.mktemp("score_swag")
    keep = "run.keep_finished_checkpoints=true"
    return {"kept": train_on_one_thread(root / "kept", *TINY, keep),
            "scale0": train_on_one_thread(root / "scale0", *TINY, keep, "method.scale=0", "method.diag_scale=0"),
            "default": train_on_one_thread(root / "default", *TINY)}


def test_at_scale_zero_the_samples_drawn_again_score_as_the_runs_own_swag_did(runs, capsys):
    own = json.loads((runs["scale0"] / "metrics.json").read_text())
    record = main([str(runs["scale0"]), "--data", "test", "--device", "cpu"])[str(runs["scale0"])]["records"][0]
    for name in ("swag", "swag_diag", "swag+ts"):
        for metric in ("acc", "nll", "ece", "brier"):
            assert record["predictors"][name][metric] == pytest.approx(own[name][metric], rel=1e-5, abs=1e-6), \
                (name, metric)
    assert record["swag_samples"]["samples"] == 2 and record["swag_samples"]["moments_from"] == "checkpoints/epoch0004.pt"
    assert not any(name.startswith("swag") for name in record["not_scored"])


def test_swag_is_scored_on_a_corrupted_set_and_in_ood_detection_with_the_samples_asked_for(runs, capsys):
    result = main([str(runs["kept"]), "--data", "cifar10c:contrast:5", "--ood", "noise:gaussian", "--device", "cpu",
                   "--swag-samples", "3"])[str(runs["kept"])]
    corrupted = result["records"][0]
    assert {"swag", "swag_diag", "swa", "sgd"} <= set(corrupted["predictors"])
    assert corrupted["swag_samples"]["samples"] == 3
    assert corrupted["predictors"]["swag"]["acc"] != corrupted["predictors"]["swa"]["acc"] or \
        corrupted["predictors"]["swag"]["nll"] != corrupted["predictors"]["swa"]["nll"]  # samples, not the average
    detected = result["ood"][0]["predictors"]
    assert 0 <= detected["swag"]["msp"]["auroc"] <= 1 and "swag_diag" in detected


def test_a_set_scored_with_the_runs_own_sample_count_is_kept_whether_or_not_it_is_typed(runs, capsys):
    """The run draws method.samples=2 by default: --swag-samples 2 asks for the same samples (kept), 3 for others."""
    sets = [str(runs["kept"]), "--data", "cifar10c:fog:1", "--device", "cpu"]
    main(sets)
    capsys.readouterr()
    main([*sets, "--swag-samples", "2"])
    assert "on cifar10c-fog-1: kept, scored before" in capsys.readouterr().out
    record = main([*sets, "--swag-samples", "3"])[str(runs["kept"])]["records"][0]
    assert "kept, scored before" not in capsys.readouterr().out and record["swag_samples"]["samples"] == 3


def test_a_swag_run_without_its_last_checkpoint_says_how_to_keep_it(runs, capsys):
    record = main([str(runs["default"]), "--data", "test", "--device", "cpu"])[str(runs["default"])]["records"][0]
    assert "swag" not in record["predictors"] and "swa" in record["predictors"]
    assert "run.keep_finished_checkpoints=true" in record["not_scored"]["swag"]
    # the flag is no part of the run's identity: typed on the same command it finds the run finished and skips it
    assert "run.dir=<dir>" in record["not_scored"]["swag"] and "skips" in record["not_scored"]["swag"]
    assert "swag_samples" not in record


def test_swag_samples_below_one_are_refused(runs):
    from swalab.results.score import ScoreError

    with pytest.raises(ScoreError, match="--swag-samples 0"):
        main([str(runs["kept"]), "--data", "test", "--swag-samples", "0"])
