"""``python -m swalab.results.score``: a finished run's predictors scored again on other test sets (its own test split,
CIFAR-10-C-style corruptions of it), written under ``<run>/scores/`` without touching the run's records; and
``swalab.data.corruptions`` against the published CIFAR-10-C parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swalab.data import corruptions
from swalab.data.splits import DataSplit
from swalab.results.score import ScoreError, main, parse_data, severity_summary

TINY = ["dataset.train_size=96", "dataset.val_size=48", "trainer.batch_size=32", "run.eval_every=0", "trainer.epochs=4"]


@pytest.fixture(scope="module")
def swa_run(tmp_path_factory):
    from conftest import train_on_one_thread

    root = tmp_path_factory.mktemp("score")
    return train_on_one_thread(root / "swa", *TINY, "method=swa", "model.swa.start_epoch=2",
                               f"run.cache_dir={root / 'cache'}")


def test_rescoring_a_run_on_its_own_test_split_gives_the_numbers_of_its_metrics_json(swa_run, capsys):
    own = json.loads((swa_run / "metrics.json").read_text())
    result = main([str(swa_run), "--data", "test", "--device", "cpu"])
    scored = result[str(swa_run)]["records"][0]["predictors"]
    assert {"sgd", "swa", "sgd+ts", "swa+ts"} <= set(scored)
    for name in ("sgd", "swa", "swa+ts"):
        for metric in ("acc", "nll", "ece", "brier"):
            assert scored[name][metric] == pytest.approx(own[name][metric], rel=1e-5, abs=1e-6), (name, metric)
    written = json.loads((swa_run / "scores" / "test" / "metrics.json").read_text())
    assert written["predictors"]["swa"]["acc"] == scored["swa"]["acc"] and "ece_mass20" in written["predictors"]["swa"]
    assert (swa_run / "scores" / "test" / "predictions.pt").exists()
    assert json.loads((swa_run / "metrics.json").read_text()) == own  # the run's own record untouched


def test_a_corrupted_test_set_is_scored_per_severity_and_summarised_over_corruptions(swa_run, capsys):
    result = main([str(swa_run), "--data", "cifar10c:contrast:5", "--data", "cifar10c:gaussian_noise:5",
                   "--device", "cpu"])
    records = result[str(swa_run)]["records"]
    assert [r["data"]["name"] for r in records] == ["cifar10c-contrast-5", "cifar10c-gaussian_noise-5"]
    clean = json.loads((swa_run / "metrics.json").read_text())
    assert records[0]["predictors"]["swa"]["nll"] != pytest.approx(clean["swa"]["nll"])  # other images, other numbers
    summary = json.loads((swa_run / "scores" / "cifar10c-summary.json").read_text())
    mean_acc = (records[0]["predictors"]["swa"]["acc"] + records[1]["predictors"]["swa"]["acc"]) / 2
    assert summary["swa"]["5"]["corruptions"] == 2 and summary["swa"]["5"]["acc"] == pytest.approx(mean_acc)
    assert "under corruption, per severity" in capsys.readouterr().out


def test_a_data_spec_that_cannot_be_made_is_refused_naming_it_before_any_run_is_opened(tmp_path, monkeypatch):
    monkeypatch.setattr(corruptions, "frost_dir", lambda: None)  # imagecorruptions (its frost photographs) absent
    with pytest.raises(ScoreError, match=r"--data cifar10c:frost:2: corruption 'frost' needs the frost photographs"):
        main([str(tmp_path / "no-run"), "--data", "cifar10c:frost:2"])
    with pytest.raises(ScoreError, match=r"--data cifar10c:contrast:6: severity 6 of contrast: give 1 to 5"):
        parse_data("cifar10c:contrast:6")
    with pytest.raises(ScoreError, match=r"--data imagenet-c: expected test, cifar10c"):
        parse_data("imagenet-c")


def test_cifar10c_all_names_every_corruption_made_here_at_five_severities(tmp_path, monkeypatch):
    monkeypatch.setattr(corruptions, "frost_dir", lambda: tmp_path)
    specs = parse_data("cifar10c:all")
    assert len(specs) == 5 * 15 == 5 * len(corruptions.MADE)
    assert {s.corruption for s in specs} == set(corruptions.MADE) and {s.severity for s in specs} == {1, 2, 3, 4, 5}


def test_the_severity_summary_is_the_mean_over_corruptions_of_each_severity():
    records = [{"data": {"severity": 1}, "predictors": {"swa": {"acc": 80.0, "nll": 0.5, "ece": 0.1, "brier": 0.3}}},
               {"data": {"severity": 1}, "predictors": {"swa": {"acc": 60.0, "nll": 1.5, "ece": 0.3, "brier": 0.5}}},
               {"data": {"severity": 2}, "predictors": {"swa": {"acc": 50.0, "nll": 2.0, "ece": 0.2, "brier": 0.6}}}]
    summary = severity_summary(records)
    assert summary["swa"]["1"] == pytest.approx({"corruptions": 2, "acc": 70.0, "nll": 1.0, "ece": 0.2, "brier": 0.4})
    assert summary["swa"]["2"]["corruptions"] == 1


# -- the corruptions ---------------------------------------------------------------------------------------------------

def test_the_32x32_parameters_are_the_published_cifar10c_ones_not_imagenet_cs():
    """Values of hendrycks/robustness make_cifar_c.py (ImageNet-C's, in imagecorruptions, are e.g. gaussian noise
    0.08 .. 0.38, JPEG quality 25 .. 7)."""
    p = corruptions.PARAMETERS_32
    assert len(p) == 15 and all(len(v) == 5 for v in p.values())
    assert p["gaussian_noise"] == [0.04, 0.06, .08, .09, .10]
    assert p["jpeg_compression"] == [80, 65, 58, 50, 40]
    assert p["contrast"] == [.75, .5, .4, .3, 0.15]
    assert p["defocus_blur"][3] == (1, 0.2) and p["fog"][4] == (1.5, 1.75)


@pytest.mark.parametrize("name", sorted(set(corruptions.MADE) - {"frost"}))  # frost: tests/test_corruptions.py
def test_each_corruption_is_deterministic_keeps_the_shape_and_changes_the_images(name):
    images = torch.randint(0, 256, (6, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    out = corruptions.corrupt_images(images, name, 3)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert torch.equal(out, corruptions.corrupt_images(images, name, 3))
    assert not torch.equal(out, images)


def test_an_image_is_corrupted_alike_whatever_the_images_around_it():
    images = torch.randint(0, 256, (4, 1, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    whole = corruptions.corrupt_images(images, "gaussian_noise", 2)
    assert torch.equal(whole[0], corruptions.corrupt_images(images[:1], "gaussian_noise", 2)[0])


def test_contrast_pulls_each_channel_towards_its_mean_by_the_published_factor():
    x = np.linspace(0, 1, 2 * 2 * 3).reshape(2, 2, 3)
    out = corruptions.contrast(x, 0.5, None)
    np.testing.assert_allclose(out, (x - x.mean(axis=(0, 1))) * 0.5 + x.mean(axis=(0, 1)))


def test_a_corrupted_split_is_cached_fingerprinted_and_read_back(tmp_path):
    split = DataSplit(torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8), torch.arange(5))
    made, fingerprint = corruptions.corrupted_split(split, "brightness", 4, cache_dir=tmp_path)
    assert list(tmp_path.glob("corrupted-brightness-4-*.pt"))
    again, same = corruptions.corrupted_split(split, "brightness", 4, cache_dir=tmp_path)
    assert torch.equal(made.images, again.images) and fingerprint == same == corruptions.fingerprint(made.images)
    assert torch.equal(made.labels, split.labels)


# -- out-of-distribution detection -----------------------------------------------------------------------------------

def test_auroc_aupr_and_fpr95_of_perfectly_separated_scores_are_one_one_and_zero():
    from swalab.results.ood import detection

    assert detection(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.9])) == {"auroc": 1.0, "aupr": 1.0, "fpr95": 0.0}


def test_auroc_counts_ties_half_and_equals_the_pairwise_probability():
    from swalab.results.ood import auroc

    ins, outs = torch.tensor([0.1, 0.4, 0.5, 0.5]), torch.tensor([0.5, 0.2, 0.9])
    pairs = [(1.0 if o > i else 0.5 if o == i else 0.0) for o in outs.tolist() for i in ins.tolist()]
    assert auroc(ins, outs) == pytest.approx(sum(pairs) / len(pairs))


def test_aupr_is_the_average_precision_over_the_ood_images_ranks():
    from swalab.results.ood import aupr

    # ranked: out (0.9), in (0.8), out (0.7), in (0.1): precision at each OOD image 1/1 and 2/3, each half the recall
    assert aupr(torch.tensor([0.8, 0.1]), torch.tensor([0.9, 0.7])) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)


def test_fpr95_is_the_in_distribution_share_at_or_above_the_threshold_flagging_95_percent_of_ood():
    from swalab.results.ood import fpr_at_tpr

    outs = torch.arange(20, dtype=torch.float64)  # 95% of 20 = 19 flagged: threshold 1.0
    assert fpr_at_tpr(torch.tensor([0.5, 1.0, 3.0, -1.0]), outs) == pytest.approx(0.5)


def test_mutual_information_is_the_predictive_entropy_minus_the_members_mean_entropy():
    from swalab.results.ood import entropy, uncertainty

    a, b = torch.tensor([[0.9, 0.1]]).log(), torch.tensor([[0.1, 0.9]]).log()
    mean = torch.tensor([[0.5, 0.5]]).log()
    mi = uncertainty(mean, [a, b])["mutual_information"]
    assert float(mi) == pytest.approx(float(entropy(mean) - (entropy(a) + entropy(b)) / 2))
    assert "mutual_information" not in uncertainty(mean)


def test_a_run_detects_noise_and_an_image_folder_against_its_test_split(swa_run, tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "other" / "any"
    folder.mkdir(parents=True)
    for i in range(5):
        Image.fromarray(np.full((20, 30, 3), 40 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    result = main([str(swa_run), "--ood", "noise:uniform", "--ood", f"folder:{tmp_path / 'other'}", "--device", "cpu"])
    noise, images = result[str(swa_run)]["ood"]
    assert noise["data"]["name"] == "ood-noise-uniform" and images["data"]["out_of_distribution"] == 5
    for record in (noise, images):
        for score in ("msp", "entropy"):
            assert 0.0 <= record["predictors"]["swa"][score]["auroc"] <= 1.0
    assert "swa+ts" in noise["predictors"]
    written = json.loads((swa_run / "scores" / "ood-noise-uniform" / "metrics.json").read_text())
    assert written["predictors"] == json.loads(json.dumps(noise["predictors"]))
    assert "OOD images are the positives" in capsys.readouterr().out
    from swalab.results.ood import PER_IMAGE_FILE, auroc, read_kept_scores

    kept = read_kept_scores(swa_run / "scores" / "ood-noise-uniform" / PER_IMAGE_FILE)  # for the report's ROC curves
    assert set(kept) == set(noise["predictors"]) and set(kept["swa"]) == {"msp", "entropy"}
    ins, outs = kept["swa"]["msp"]
    assert (len(ins), len(outs)) == (noise["data"]["in_distribution"], noise["data"]["out_of_distribution"])
    assert auroc(ins, outs) == pytest.approx(noise["predictors"]["swa"]["msp"]["auroc"], abs=2e-3)  # float16 kept


def test_an_ood_folder_of_no_image_or_with_an_image_cut_short_is_refused_in_one_line_naming_it(swa_run, tmp_path,
                                                                                               capsys):
    """Found while the run is scored (its test split's count says how many images are read): one line, exit 2, not
    a traceback."""
    from PIL import Image

    from swalab.cli import run_command

    empty, cut = tmp_path / "empty", tmp_path / "cut"
    empty.mkdir()
    cut.mkdir()
    Image.fromarray(np.full((20, 30, 3), 9, dtype=np.uint8)).save(cut / "0.jpg")
    (cut / "1.jpg").write_bytes((cut / "0.jpg").read_bytes()[:100])
    for folder, said in ((empty, "no image files"), (cut, f"{cut / '1.jpg'} cannot be read as an image")):
        with pytest.raises(SystemExit) as exited:
            run_command(main, [str(swa_run), "--ood", f"folder:{folder}", "--device", "cpu"],
                        prog="swalab.results.score")
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and len(err) == 1 and said in err[0], err


def test_an_ood_spec_that_names_nothing_is_refused_before_any_run_is_opened(tmp_path):
    with pytest.raises(ScoreError, match=r"--ood noise:pink: expected noise:gaussian, noise:uniform, folder:<dir> or other-classes"):
        main([str(tmp_path / "no-run"), "--ood", "noise:pink"])
    with pytest.raises(ScoreError, match=r"--ood folder:.*missing is no folder"):
        main([str(tmp_path / "no-run"), "--ood", f"folder:{tmp_path / 'missing'}"])


def test_the_severity_summary_keeps_the_corruptions_scored_by_earlier_commands(swa_run, capsys):
    main([str(swa_run), "--data", "cifar10c:brightness:1", "--device", "cpu"])
    main([str(swa_run), "--data", "cifar10c:pixelate:1", "--device", "cpu"])
    summary = json.loads((swa_run / "scores" / "cifar10c-summary.json").read_text())
    assert summary["swa"]["1"]["corruptions"] == 2


def test_the_report_shows_a_runs_scores_on_other_data_and_its_ood_detection(swa_run, tmp_path, capsys):
    from swalab.results.report import report

    main([str(swa_run), "--data", "cifar10c:contrast:2", "--ood", "noise:gaussian", "--device", "cpu"])
    report([swa_run.parent], tmp_path / "out")
    table = (tmp_path / "out" / "table.md").read_text()
    assert "## Scored on other data (python -m swalab.results.score)" in table
    run = "| digits / preresnet20 · SWA 1.5B (4 ep) · seed 0 |"  # its row, column and seed: no two runs alike
    assert f"{run} cifar10c-contrast-2 | swa |" in table
    assert "## Out-of-distribution detection" in table and f"{run} ood-noise-gaussian | swa | msp |" in table


def test_the_reports_tables_of_scores_count_a_run_found_in_two_folders_once(swa_run, tmp_path):
    """The same run in two folders given to the report is counted once in its table ("repeats ... counted once"),
    and so in the tables of scores on other data: each scored set once, not once per copy."""
    import shutil

    from swalab.results.report import report

    main([str(swa_run), "--data", "cifar10c:contrast:2", "--ood", "noise:gaussian", "--device", "cpu"])
    copy = tmp_path / "copy" / "swa"
    shutil.copytree(swa_run, copy)
    report([swa_run.parent, copy.parent], tmp_path / "out")
    table = (tmp_path / "out" / "table.md").read_text()
    assert "counted once" in table
    assert len([line for line in table.splitlines() if "| cifar10c-contrast-2 | swa |" in line]) == 1
    assert len([line for line in table.splitlines() if "| ood-noise-gaussian | swa | msp |" in line]) == 1


def test_a_run_given_twice_under_two_spellings_is_scored_once_not_refused_as_held_by_another_process(swa_run,
                                                                                                    capsys):
    result = main([str(swa_run), f"{swa_run}/.", "--data", "test", "--device", "cpu"])
    assert list(result) == [str(swa_run)]
    out = capsys.readouterr().out  # scored now or kept from an earlier test: its table once either way
    assert out.count("swa/seed0 on test (") == 1 and out.count("swa/seed0 on test: kept") <= 1


def test_a_set_asked_twice_in_one_command_is_scored_and_shown_once(swa_run, capsys):
    """cifar10c:contrast:4 given with cifar10c:contrast (which holds it), an OOD set given twice: each once."""
    result = main([str(swa_run), "--data", "cifar10c:contrast:4", "--data", "cifar10c:contrast", "--ood",
                   "noise:uniform", "--ood", "noise:uniform", "--device", "cpu"])[str(swa_run)]
    assert [r["data"]["name"] for r in result["records"]] == ["cifar10c-contrast-4", *(f"cifar10c-contrast-{s}"
                                                                                     for s in (1, 2, 3, 5))]
    assert len(result["ood"]) == 1
    out = capsys.readouterr().out  # scored now or kept from an earlier test: its table once either way
    assert out.count("split against ood-noise-uniform (") == 1 and out.count("against ood-noise-uniform: kept") <= 1


def test_a_predictor_not_scored_is_named_once_per_run_not_once_per_set(tmp_path, capsys):
    """A run's budget marks (and post-hoc averages) keep no weights, so no set scores them: over 75 corrupted sets
    their reasons were printed 75 times each; once per run is enough."""
    from conftest import train_on_one_thread

    from swalab.results.score import not_scored_lines

    run = train_on_one_thread(tmp_path / "swa", *[a for a in TINY if not a.startswith("trainer.epochs")],
                              "model.budget_epochs=4", "method=swa", "model.swa.start_epoch=2",
                              "model.swa.score_at_budgets=[1.0]", f"run.cache_dir={tmp_path / 'cache'}")
    records = main([str(run), "--data", "cifar10c:contrast:3", "--data", "cifar10c:contrast:2", "--device",
                    "cpu"])[str(run)]["records"]
    assert records[0]["not_scored"] and records[0]["not_scored"] == records[1]["not_scored"]  # the same reasons twice
    out = capsys.readouterr().out
    lines = not_scored_lines(records[0]["not_scored"])  # swa@1 (and swa@1+ts): a budget mark ...
    assert lines and all(out.count(f"  not scored: {line}\n") == 1 for line in lines)


# -- a set scored before is kept; a score record is whole or absent; one score of a run at a time ----------------------

def test_a_set_scored_before_from_the_same_weights_and_images_is_kept_and_again_scores_it_anew(swa_run, capsys):
    sets = [str(swa_run), "--data", "cifar10c:snow:3", "--ood", "noise:uniform", "--device", "cpu"]
    first = main(sets)[str(swa_run)]
    records = [swa_run / "scores" / name / "metrics.json" for name in ("cifar10c-snow-3", "ood-noise-uniform")]
    written = [path.stat().st_mtime_ns for path in records]
    capsys.readouterr()
    second = main(sets)[str(swa_run)]
    out = capsys.readouterr().out
    assert "on cifar10c-snow-3: kept, scored before from the same weights and images" in out
    assert "against ood-noise-uniform: kept" in out
    assert [path.stat().st_mtime_ns for path in records] == written  # nothing written again
    assert second["records"] == first["records"] and second["ood"] == first["ood"]
    main([*sets, "--again"])
    assert "kept" not in capsys.readouterr().out
    assert all(path.stat().st_mtime_ns != was for path, was in zip(records, written))


def test_swag_samples_asked_of_a_run_that_draws_none_keep_the_sets_it_scored_before(swa_run, capsys):
    """A grid's runs scored with --swag-samples (for its SWAG runs): a SWA run draws no samples, so its sets scored
    before without the flag are kept."""
    sets = [str(swa_run), "--data", "cifar10c:snow:4", "--device", "cpu"]
    main(sets)
    capsys.readouterr()
    main([*sets, "--swag-samples", "5"])
    assert "on cifar10c-snow-4: kept, scored before" in capsys.readouterr().out


def test_a_set_is_scored_anew_once_the_runs_weights_change(swa_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run)
    sets = [str(run), "--data", "cifar10c:brightness:4", "--device", "cpu"]
    before = main(sets)[str(run)]["records"][0]["predictors"]["swa"]["nll"]
    state = torch.load(run / "final.pt", weights_only=False)
    weights = state["methods"]["swa"]
    name = next(k for k, v in weights.items() if torch.is_tensor(v) and v.is_floating_point() and v.dim() == 4)
    weights[name] = weights[name] * 1.5  # as if the run had trained again
    torch.save(state, run / "final.pt")
    capsys.readouterr()
    after = main(sets)[str(run)]["records"][0]["predictors"]["swa"]["nll"]
    assert "kept" not in capsys.readouterr().out and after != before


def test_a_set_scored_before_the_runs_weights_changed_is_left_out_of_the_report_naming_the_command(swa_run, tmp_path):
    """As a post-hoc average of files that changed is: the report showed the scores of the weights the run held then
    beside the table of the weights it holds now, and said nothing."""
    import shutil

    from swalab.results.report import report

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("scores", "posthoc"))
    main([str(run), "--data", "cifar10c:brightness:2", "--device", "cpu"])
    state = torch.load(run / "final.pt", weights_only=False)
    weights = state["methods"]["swa"]
    name = next(k for k, v in weights.items() if torch.is_tensor(v) and v.is_floating_point() and v.dim() == 4)
    weights[name] = weights[name] * 1.5  # as if the run had trained again
    torch.save(state, run / "final.pt")
    report([run], tmp_path / "out")
    table, _, notes = (tmp_path / "out" / "table.md").read_text().partition("## Not in the table")
    assert "cifar10c-brightness-2" not in table
    [stale] = [line for line in notes.splitlines() if "scores/cifar10c-brightness-2" in line]
    assert "(final.pt)" in stale, stale
    assert stale.endswith(f"python -m swalab.results.score {run} --data cifar10c:brightness:2"), stale


def test_the_scores_of_a_run_kept_without_its_weights_stay_in_the_report(swa_run, tmp_path):
    """An archive of a run's records (the shift evidence's runs.tgz) holds no final.pt: a file that is gone is no
    sign of other weights, so its scores stand in the report."""
    import shutil

    from swalab.results.report import report

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("scores", "posthoc"))
    main([str(run), "--data", "cifar10c:brightness:2", "--device", "cpu"])
    (run / "final.pt").unlink()
    report([run], tmp_path / "out")
    table, _, notes = (tmp_path / "out" / "table.md").read_text().partition("## Not in the table")
    assert "cifar10c-brightness-2" in table and "stale" not in notes



def test_a_final_pt_cut_short_is_one_line_saying_what_to_do_and_nothing_is_written(swa_run, tmp_path, capsys):
    """A run's final.pt cut short (a copy, a full disk) was named with torch's reason alone: nothing said what to do."""
    import shutil

    from swalab.cli import run_command

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("scores", "posthoc"))
    (run / "final.pt").write_bytes((run / "final.pt").read_bytes()[:3000])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_command(main, [str(run), "--data", "test", "--device", "cpu"], prog="swalab.results.score")
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'final.pt'}: cannot read it" in err[0], err
    assert err[0].endswith("restore it from a copy of the run, or move its metrics.json away and re-run its command "
                           "to train it again"), err
    assert not (run / "scores").exists()


def score_cli(*args: str, fault: str | None = None, wait: bool = True):
    """``python -m swalab.results.score <args> --device cpu`` in a child process, optionally with a planned fault
    (``swalab.faults``); the finished process, or the running one (``wait=False``)."""
    import os
    import signal
    import subprocess
    import sys

    from swalab import faults

    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, "OMP_NUM_THREADS": "1"}
    if fault:
        env[faults.ENV] = fault
    cmd = [sys.executable, "-m", "swalab.results.score", *args, "--device", "cpu"]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if not wait:
        return child
    out, err = child.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def record_matches_its_predictions(folder) -> bool:
    """Whether ``metrics.json``'s accuracy of every predictor is the one its ``predictions.pt`` beside it gives (to a
    point: the kept log-probabilities are float16, whose ties move an image or two of 360 to another class)."""
    record = json.loads((folder / "metrics.json").read_text())
    kept = torch.load(folder / "predictions.pt", weights_only=True)
    for name, m in record["predictors"].items():
        acc = 100.0 * (kept["log_probs"][name].float().argmax(1) == kept["labels"]).float().mean().item()
        if acc != pytest.approx(m["acc"], abs=1.0):
            return False
    return True


def test_a_score_killed_between_a_sets_predictions_and_its_metrics_leaves_that_set_absent_and_the_same_command_writes_it_whole(swa_run):
    from swalab.results.runs import Run

    sets = ["--data", "cifar10c:zoom_blur:1", "--data", "cifar10c:zoom_blur:2"]
    assert main([str(swa_run), *sets, "--device", "cpu"])  # an earlier, whole record of both sets
    first, second = (swa_run / "scores" / f"cifar10c-zoom_blur-{s}" for s in (1, 2))
    earlier = json.loads((second / "metrics.json").read_text())
    earlier["predictors"]["swa"]["acc"] = -1.0  # as if the run had other weights then: no longer its predictions'
    (second / "metrics.json").write_text(json.dumps(earlier))

    killed = score_cli(str(swa_run), *sets, "--again", fault="record_commit:2")  # kill -9 after the second set's
    #                                                                              predictions
    assert killed.returncode == -9, killed.stderr
    assert record_matches_its_predictions(first)
    assert not (second / "metrics.json").exists()  # no earlier metrics beside the new predictions: no record at all
    assert f"cifar10c-zoom_blur-2" not in Run(swa_run).scores

    main([str(swa_run), *sets, "--device", "cpu"])  # the same command again scores the set again, whole
    assert record_matches_its_predictions(second)


def test_a_score_interrupted_by_ctrl_c_says_so_in_one_line_and_leaves_each_set_whole_or_absent(swa_run):
    sets = ["--data", "cifar10c:pixelate:2", "--data", "cifar10c:pixelate:3"]
    interrupted = score_cli(str(swa_run), *sets, fault="record_commit:2:INT")
    assert interrupted.returncode == 130, interrupted.stderr
    assert "Traceback" not in interrupted.stderr
    lines = interrupted.stderr.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "keeps the whole ones and scores the rest" in lines[0]
    assert record_matches_its_predictions(swa_run / "scores" / "cifar10c-pixelate-2")
    assert not (swa_run / "scores" / "cifar10c-pixelate-3" / "metrics.json").exists()


def test_a_score_stopped_by_sigterm_says_so_in_one_line_like_ctrl_c_and_leaves_each_set_whole_or_absent(swa_run):
    """``kill`` (a job's time limit) while the second set is written ends the command as Ctrl-C does: one line,
    exit 143 (128 + SIGTERM), the first set whole, the second without a record."""
    sets = ["--data", "cifar10c:elastic_transform:2", "--data", "cifar10c:elastic_transform:3"]
    stopped = score_cli(str(swa_run), *sets, fault="record_commit:2:TERM")
    assert stopped.returncode == 143, stopped.stderr
    lines = stopped.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "keeps the whole ones and scores the rest" in lines[0], lines
    assert record_matches_its_predictions(swa_run / "scores" / "cifar10c-elastic_transform-2")
    assert not (swa_run / "scores" / "cifar10c-elastic_transform-3" / "metrics.json").exists()


def test_a_score_stopped_by_sigterm_before_it_wrote_anything_leaves_no_scores_folder(swa_run, tmp_path):
    """SIGTERM once ``scores/`` is locked, before any set is written: the folder the lock made is removed again, as
    after Ctrl-C or a refusal, so no empty ``scores/`` holding only ``.lock`` is left in the run."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("scores"))
    stopped = score_cli(str(run), "--data", "test", fault="folders_held:1:TERM")
    assert stopped.returncode == 143, stopped.stderr
    assert len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
    assert not (run / "scores").exists()


def test_a_scores_folder_left_by_kill_9_holding_only_its_lock_troubles_neither_the_next_score_nor_the_report(
        swa_run, tmp_path):
    """``kill -9`` runs no clean-up: ``scores/.lock`` and a set's predictions without its ``metrics.json`` stay. The
    next score takes the lock over and writes the set whole; the report reads only whole records."""
    import shutil

    from swalab.results.runs import Run

    run = tmp_path / "copy"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("scores"))
    killed = score_cli(str(run), "--data", "test", fault="folders_held:1:KILL")
    assert killed.returncode == -9, killed.stderr
    assert [p.name for p in (run / "scores").iterdir()] == [".lock"]
    assert Run(run).scores == {}
    again = score_cli(str(run), "--data", "test")
    assert again.returncode == 0, again.stderr
    assert record_matches_its_predictions(run / "scores" / "test")


def test_the_same_score_started_twice_on_one_run_is_refused_in_one_line_naming_the_process_that_scores_it(swa_run):
    import os
    import signal
    import time

    from swalab.cli import run_command

    holder = score_cli(str(swa_run), "--data", "cifar10c:fog:1", fault="record_commit:1:STOP", wait=False)
    try:
        for _ in range(600):  # until it is frozen before its record's metrics.json (or has ended: no such point)
            state = open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[0]
            if state in ("T", "Z") or holder.poll() is not None:
                break
            time.sleep(0.1)
        assert state == "T", "the first score never stopped at its record's commit"
        with pytest.raises(SystemExit) as exited:
            run_command(main, [str(swa_run), "--data", "cifar10c:fog:1", "--device", "cpu"], prog="swalab.results.score")
        assert exited.value.code == 2
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate()


def test_the_refusal_of_a_second_score_names_the_run_and_the_holder(swa_run, capsys):
    import fcntl
    import os

    from swalab.cli import run_command
    from swalab.runlock import LOCK_FILE

    (swa_run / "scores").mkdir(exist_ok=True)
    fd = os.open(swa_run / "scores" / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.pwrite(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": 0}).encode(), 0)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: this process's own later flock is refused too
    try:
        with pytest.raises(SystemExit):
            run_command(main, [str(swa_run), "--data", "cifar10c:fog:2", "--device", "cpu"], prog="swalab.results.score")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(swa_run) in err[0] and "PID 4242 on host elsewhere" in err[0], err
    assert not (swa_run / "scores" / "cifar10c-fog-2").exists()


def test_score_given_a_directory_that_is_no_run_says_so_in_one_line_exits_2_and_scores_no_run_given_before_it(swa_run,
                                                                                                            tmp_path):
    (tmp_path / "notes").mkdir()
    done = score_cli(str(swa_run), str(tmp_path / "notes"), "--data", "cifar10c:snow:1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path / 'notes'} is not a swalab run directory" in lines[0], lines
    assert not (swa_run / "scores" / "cifar10c-snow-1").exists()


def test_two_ood_folders_of_one_name_are_scored_as_two_sets_and_labelled_apart_in_the_report(swa_run, tmp_path):
    from PIL import Image

    from swalab.results.report import report

    for value, parent in ((30, "a"), (220, "b")):
        folder = tmp_path / parent / "val" / "any"
        folder.mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((12, 12, 3), value + i, dtype=np.uint8)).save(folder / f"{i}.png")
    result = main([str(swa_run), "--ood", f"folder:{tmp_path / 'a' / 'val'}", "--ood", f"folder:{tmp_path / 'b' / 'val'}",
                   "--device", "cpu"])
    a, b = result[str(swa_run)]["ood"]
    assert a["data"]["name"] != b["data"]["name"]
    assert a["data"]["name"].startswith("ood-folder-val-") and b["data"]["name"].startswith("ood-folder-val-")
    for record, parent in ((a, "a"), (b, "b")):
        written = json.loads((swa_run / "scores" / record["data"]["name"] / "metrics.json").read_text())
        assert written["data"]["spec"] == f"folder:{tmp_path / parent / 'val'}"
        assert written["data"]["fingerprint"] == record["data"]["fingerprint"]
    assert a["data"]["fingerprint"] != b["data"]["fingerprint"]
    report([swa_run.parent], tmp_path / "out")
    table = (tmp_path / "out" / "table.md").read_text()
    assert f"| {a['data']['name']} |" in table and f"| {b['data']['name']} |" in table


def test_a_run_whose_image_folder_changed_since_is_refused_naming_what_changed_and_nothing_is_written(tmp_path):
    """A run is the images it was made on: scored on its folder as it is now (an image added to its test split),
    its ``test`` would be another test set under the run's own name, as run.py refuses to resume or skip it."""
    from conftest import train_on_one_thread
    from test_folder_data import write_folder, write_images

    from swalab.config import ConfigError

    root = write_folder(tmp_path / "ds", ["cat", "dog"], n_train=4, n_test=2, size=(8, 8), grey=True)
    run = train_on_one_thread(tmp_path / "run", "dataset=folder", f"dataset.root={root}", "method=sgd",
                              "trainer.epochs=1", "trainer.batch_size=4", "model.arch.depth=8",
                              f"run.cache_dir={tmp_path / 'cache'}")
    write_images(root / "test" / "dog", 1, size=(8, 8), grey=True, first=50)
    with pytest.raises(ConfigError, match=r"was made on other data than .* holds now \(test/dog: 2 files then, 3 "
                                          r"now\): restore the images it was made on"):
        main([str(run), "--data", "test", "--device", "cpu"])
    assert not (run / "scores").exists()


def test_a_predictor_and_its_temperature_scaled_twin_not_scored_for_one_reason_are_one_line():
    from swalab.results.score import not_scored_lines

    why = {"lawa2": "a post-hoc average", "lawa2+ts": "a post-hoc average", "swa@1.25": "a budget mark",
           "fge+ts": "no members"}
    assert not_scored_lines(why) == ["lawa2 (and lawa2+ts): a post-hoc average", "swa@1.25: a budget mark",
                                     "fge+ts: no members"]
