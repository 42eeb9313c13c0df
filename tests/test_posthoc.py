"""``python -m swalab.posthoc``: averages built after training from snapshots, scored like online predictors.

The runs are the tiny SWA run of tests/test_reliability.py (PreResNet-8 on 256 digits, batch 64: 4 steps per epoch, 4
epochs, averaging from epoch 2, a capture every epoch) with a validation split of 100 images and a snapshot every
epoch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from swalab.config import ConfigError
from swalab.models.timm_models import create_timm_model
from swalab.posthoc import PosthocError, folder_name, start_weights
from swalab.posthoc.__main__ import main, online_of
from swalab.posthoc.averages import ema_of, greedy_soup, interpolate, mean_of
from swalab.results.compare import score_run
from swalab.results.report import report
from swalab.rundir import file_fingerprint
from swalab.snapshots import snapshots_of
from swalab.train import train
from test_imagenet import tiny_imagenet, tiny_run  # noqa: F401 (a fixture)
from test_reliability import make_cfg

SNAPSHOTS = ["run.snapshots=1", "dataset.val_size=100", "model.swa.capture_every=1"]
# The online average is a running mean in float32 (torch's AveragedModel), the post-hoc one a mean summed in float64:
# over 3 captures of weights of magnitude ~1 they differ by float32 rounding, a few 1e-7 at most.
WEIGHT_TOL = 1e-6
# Its BatchNorm statistics are recomputed over the same batches from weights that differ by that much: its NLL by
# a few 1e-7 (measured: 2.4e-7 on the digits).
METRIC_TOL = 1e-5


@pytest.fixture(scope="module")
def swa_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("posthoc") / "swa"
    train(make_cfg(*SNAPSHOTS), run_dir=run)
    return run


@pytest.fixture(scope="module")
def swa_seed1(swa_run) -> Path:
    run = swa_run.parent / "swa-seed1"
    train(make_cfg(*SNAPSHOTS, "seed=1"), run_dir=run)
    return run


def posthoc_metrics(run: Path, folder: str) -> dict:
    return json.loads((run / "posthoc" / folder / "metrics.json").read_text())


def test_the_window_of_a_swa_runs_capture_epochs_reproduces_its_online_average(swa_run):
    online = torch.load(swa_run / "final.pt", weights_only=False)["methods"]["swa"]
    window = mean_of(s.weights() for s in snapshots_of(swa_run) if 2 <= s.epoch <= 4)
    for name, param in online.items():
        if name.endswith(("running_mean", "running_var", "num_batches_tracked", "n_averaged")):
            continue  # BN statistics: recomputed below, on both sides
        assert torch.allclose(window[name], param.float(), rtol=0, atol=WEIGHT_TOL), name

    main([str(swa_run), "--swa", "2:4"])
    posthoc = posthoc_metrics(swa_run, "swa_2-4")["swa[2:4]"]
    scored = json.loads((swa_run / "metrics.json").read_text())["swa"]
    assert posthoc["acc"] == scored["acc"]
    for metric in ("nll", "ece", "brier"):
        assert posthoc[metric] == pytest.approx(scored[metric], abs=METRIC_TOL), metric
    assert posthoc["val"]["nll"] == pytest.approx(scored["val"]["nll"], abs=METRIC_TOL)
    assert posthoc["built_from"] == ["epoch0002.pt", "epoch0003.pt", "epoch0004.pt"]


def test_every_average_is_scored_like_an_online_predictor_with_its_temperature_scaled_twin(swa_run):
    main([str(swa_run), "--lawa", "2", "--ema", "0.5"])
    for folder, label in (("lawa2", "lawa2"), ("ema0.5", "ema0.5")):
        metrics = posthoc_metrics(swa_run, folder)
        assert set(metrics) == {label, f"{label}+ts"}
        assert {"acc", "nll", "ece", "brier", "val"} <= set(metrics[label])
        assert "temperature" in metrics[f"{label}+ts"]
        predictions = torch.load(swa_run / "posthoc" / folder / "predictions.pt", weights_only=False)
        assert set(predictions["log_probs"]) == {label, f"{label}+ts"}


def test_lawa_of_the_last_three_snapshots_is_the_swa_window_of_the_last_three_epochs(swa_run):
    main([str(swa_run), "--lawa", "3", "--swa", "2:"])
    lawa, swa = posthoc_metrics(swa_run, "lawa3")["lawa3"], posthoc_metrics(swa_run, "swa_2-4")["swa[2:4]"]
    assert {k: lawa[k] for k in ("acc", "nll", "ece")} == {k: swa[k] for k in ("acc", "nll", "ece")}


def test_the_runs_own_records_are_left_untouched(swa_run):
    before = {name: (swa_run / name).read_bytes() for name in ("metrics.json", "predictions.pt", "final.pt")}
    main([str(swa_run), "--ema", "0.9"])
    assert {name: (swa_run / name).read_bytes() for name in before} == before


def test_a_choice_made_on_the_test_set_is_refused_before_anything_is_built(swa_run, capsys):
    with pytest.raises(PosthocError, match="--select test: .*choose on the validation split"):
        main([str(swa_run), "--ema", "0.7", "--select", "test"])
    assert not (swa_run / "posthoc" / "ema0.7").exists()


def test_the_choice_on_validation_names_the_best_of_each_family(swa_run, capsys):
    main([str(swa_run), "--ema", "0.3", "0.6", "--select", "val"])
    out = capsys.readouterr().out
    nll = {d: posthoc_metrics(swa_run, f"ema{d}")[f"ema{d}"]["val"]["nll"] for d in ("0.3", "0.6")}
    best = min(nll, key=nll.get)
    assert f"chosen on validation nll: ema{best} " in out


def test_the_choice_on_validation_compares_the_averages_an_earlier_call_of_the_family_wrote(swa_run, capsys):
    """A sweep over two calls is one choice: the EMA decays of the first call stand beside the second's."""
    main([str(swa_run), "--ema", "0.3", "0.6"])
    main([str(swa_run), "--ema", "0.9", "--select", "val"])
    out = capsys.readouterr().out
    emas = [p.name.removeprefix("ema") for p in (swa_run / "posthoc").glob("ema*")]  # this test's and earlier ones'
    assert {"0.3", "0.6", "0.9"} <= set(emas)
    nll = {d: posthoc_metrics(swa_run, f"ema{d}")[f"ema{d}"]["val"]["nll"] for d in emas}
    best = min(nll, key=nll.get)
    [line] = [line for line in out.splitlines() if "chosen on validation" in line and " of ema for " in line]
    assert f"chosen on validation nll: ema{best} " in line
    assert line.endswith(", built by an earlier call") == (best != "0.9")


def test_a_window_with_fewer_than_two_snapshots_is_refused_naming_the_option(swa_run):
    with pytest.raises(PosthocError, match=r"--swa 4:4|--swa 3.5:4: the window holds 1 snapshot"):
        main([str(swa_run), "--swa", "3.5:4"])


@pytest.fixture(scope="module")
def run_without_snapshots(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("posthoc") / "no-snapshots"
    train(make_cfg("method=sgd", "trainer.epochs=2"), run_dir=run)
    return run


@pytest.mark.parametrize("option", [["--ema", "0.5"], ["--lawa", "2"], ["--swa", "1:"]])
def test_an_average_of_a_run_that_wrote_no_snapshots_is_refused_naming_run_snapshots(run_without_snapshots, option):
    """Its final weights alone are there: an "ema0.5" of them would be those weights under an average's label. The way
    on trains it again elsewhere: run.snapshots is no part of the run's identity, so the same command skips the run."""
    refusal = (rf"^{re.escape(' '.join(option))}: .* holds its final weights only .*run.snapshots=1.*run.dir=<dir>.*"
               r"the same command skips it")
    with pytest.raises(PosthocError, match=refusal):
        main([str(run_without_snapshots), *option])
    assert not (run_without_snapshots / "posthoc").exists()


def test_an_average_of_a_run_whose_snapshots_were_removed_says_so_not_that_it_wrote_none(swa_run, tmp_path):
    """A run trained with run.snapshots=1 whose snapshots/ was removed (or not copied with it): the refusal says so
    and how to go on; telling to train with run.snapshots=1, as for a run that wrote none, would be untrue."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(swa_run, copy, ignore=shutil.ignore_patterns("snapshots", "posthoc"))
    with pytest.raises(PosthocError, match=rf"^--lawa 2: {re.escape(str(copy))} was trained with run.snapshots=1, but "
                                           r"its snapshots/ holds none now \(removed or not copied\): put them back"):
        main([str(copy), "--lawa", "2"])
    assert not (copy / "posthoc").exists()


def test_the_ema_over_snapshots_is_the_recurrence_at_each_snapshot():
    states = [{"w": torch.tensor([float(i)]), "n": torch.tensor(i)} for i in range(1, 4)]
    expected = 0.5 * (0.5 * 1 + 0.5 * 2) + 0.5 * 3
    out = ema_of(states, 0.5)
    assert out["w"].item() == pytest.approx(expected) and out["n"].item() == 3


def test_wiseft_at_zero_is_the_start_and_at_one_the_final_weights():
    start, final = {"w": torch.tensor([0.0, 2.0])}, {"w": torch.tensor([4.0, 6.0])}
    assert torch.equal(interpolate(start, final, 0.0)["w"], start["w"])
    assert torch.equal(interpolate(start, final, 1.0)["w"], final["w"])
    assert torch.equal(interpolate(start, final, 0.25)["w"], torch.tensor([1.0, 3.0]))


def test_a_greedy_soup_keeps_only_the_ingredients_that_do_not_lower_the_validation_score():
    ingredients = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([100.0])}, {"w": torch.tensor([1.2])}]
    soup, kept = greedy_soup(ingredients, lambda s: -abs(s["w"].item() - 1.1))
    assert kept == [0, 2] and soup["w"].item() == pytest.approx(1.1)


def test_soups_of_two_seeds_are_written_under_the_lowest_seed_with_their_ingredients(swa_run, swa_seed1):
    main([str(swa_run), str(swa_seed1), "--soup", "uniform", "greedy"])
    uniform = posthoc_metrics(swa_run, "soup-uniform_2")["soup-uniform(2)"]
    assert uniform["built_from"] == [str(swa_run), str(swa_seed1)]
    greedy = posthoc_metrics(swa_run, "soup-greedy_2")["soup-greedy(2)"]
    assert 1 <= len(greedy["built_from"]) <= 2


def test_a_greedy_soup_ranked_by_accuracy_is_labelled_so_and_kept_beside_the_one_ranked_by_nll(swa_run, swa_seed1):
    """Both were labelled soup-greedy(2), one folder: the second call replaced the first's soup, and the report's
    column did not say which ranking it held."""
    main([str(swa_run), str(swa_seed1), "--soup", "greedy", "--by", "acc"])
    main([str(swa_run), str(swa_seed1), "--soup", "greedy"])
    assert posthoc_metrics(swa_run, "soup-greedy_2_by-acc")["soup-greedy(2)[by-acc]"]["rebuild"].endswith("--by acc")
    assert posthoc_metrics(swa_run, "soup-greedy_2")["soup-greedy(2)"]["rebuild"].endswith("--by nll")


def test_the_same_soup_asked_with_its_runs_in_another_order_is_written_once_under_its_lowest_seed(swa_run, swa_seed1):
    main([str(swa_seed1), str(swa_run), "--soup", "uniform"])
    main([str(swa_run), str(swa_seed1), "--soup", "uniform"])
    homes = [run for run in (swa_run, swa_seed1) if (run / "posthoc" / "soup-uniform_2").exists()]
    assert homes == [swa_run]  # one soup, not one per order (the report would count it as two seeds)


def test_a_soup_leaves_no_posthoc_folder_in_the_runs_it_is_not_written_under(swa_run, swa_seed1, tmp_path):
    """The soup is written under the lowest seed; the other run's posthoc/, made by its lock, held only .lock after."""
    import shutil

    runs = [tmp_path / run.name for run in (swa_run, swa_seed1)]
    for run, copy in zip((swa_run, swa_seed1), runs):
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("posthoc", "scores"))
    main([*map(str, runs), "--soup", "uniform"])
    assert (runs[0] / "posthoc" / "soup-uniform_2" / "metrics.json").exists()
    assert not (runs[1] / "posthoc").exists()


def test_a_soup_given_one_run_twice_is_refused_naming_the_run(swa_run):
    with pytest.raises(PosthocError, match="--soup: .* given twice"):
        main([str(swa_run), str(swa_run / "."), "--soup", "uniform"])


def test_a_run_given_twice_under_two_spellings_is_averaged_once_not_refused_as_held_by_another_process(swa_run,
                                                                                                     capsys):
    """``<run>`` and ``<run>/.`` are one run: its posthoc/ was locked twice by the one command, which then refused
    itself as 'another process'; given twice under one spelling, every average was built twice."""
    for twice in ([str(swa_run), f"{swa_run}/."], [str(swa_run), str(swa_run)]):
        main([*twice, "--lawa", "2"])
        built = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[swalab.posthoc] lawa2 ")]
        assert len(built) == 1, built


def test_an_average_asked_twice_in_one_call_is_built_once(swa_run, capsys):
    """--lawa 2 2, --ema 0.5 0.50, and --swa 2:4 2: of a run of 4 epochs (one window, one label): each built, printed
    and drawn once."""
    main([str(swa_run), "--lawa", "2", "2", "--ema", "0.5", "0.50", "--swa", "2:4", "2:", "--again"])  # not kept
    built = [line.split()[1] for line in capsys.readouterr().out.splitlines() if " test acc " in line]
    assert sorted(built) == ["ema0.5", "lawa2", "swa[2:4]"]


def test_a_soup_of_runs_of_other_configs_is_refused(swa_run, tmp_path):
    other = tmp_path / "other"
    train(make_cfg(*SNAPSHOTS, "trainer.batch_size=32"), run_dir=other)
    with pytest.raises(PosthocError, match="--soup: .* is another config .*trainer.batch_size"):
        main([str(swa_run), str(other), "--soup", "uniform"])


def test_wiseft_is_refused_for_a_run_that_started_from_no_weights(swa_run):
    with pytest.raises(ConfigError, match="--wiseft: .*model.init_from is null"):
        main([str(swa_run), "--wiseft", "0.5"])


def test_wiseft_interpolates_a_fine_tune_between_its_start_and_its_end(swa_run, tmp_path):
    tuned = tmp_path / "tuned"
    train(make_cfg("method=sgd", "trainer.epochs=2", f"model.init_from={swa_run}"), run_dir=tuned)
    main([str(tuned), "--wiseft", "0", "0.5", "1"])
    for alpha in ("0", "0.5", "1"):
        assert posthoc_metrics(tuned, f"wiseft{alpha}")[f"wiseft{alpha}"]["built_from"] == [str(swa_run), "final.pt"]
    nll = [posthoc_metrics(tuned, f"wiseft{a}")[f"wiseft{a}"]["nll"] for a in ("0", "0.5", "1")]
    assert len(set(nll)) == 3  # three other networks


def test_the_report_shows_post_hoc_predictors_as_predictors_of_their_run_with_their_labels(swa_run, tmp_path):
    main([str(swa_run), "--swa", "3:4"])
    found = report([swa_run], tmp_path / "report")
    table = (tmp_path / "report" / "table.md").read_text()
    assert "swa[3:4]" in table and "swa[3:4]+ts" in table
    columns = {c.method for c in found["table"].columns}
    assert {"swa", "swa[3:4]"} <= columns


def test_the_report_ensembles_the_seeds_of_a_post_hoc_column_from_the_predictions_posthoc_wrote(swa_run, swa_seed1,
                                                                                                 tmp_path):
    main([str(swa_run), "--lawa", "3"])
    main([str(swa_seed1), "--lawa", "3"])
    found = report([swa_run, swa_seed1], tmp_path / "report")
    ensemble = next(e for e in found["ensembles"] if e.column.method == "lawa3")
    assert ensemble.why is None and ensemble.seeds == [0, 1]
    members = [torch.load(run / "posthoc" / "lawa3" / "predictions.pt", weights_only=True) for run in (swa_run, swa_seed1)]
    mean = torch.stack([m["log_probs"]["lawa3"].float().exp() for m in members]).mean(0)
    accuracy = 100 * (mean.argmax(1) == members[0]["labels"]).float().mean().item()
    assert ensemble.metrics["acc"] == pytest.approx(accuracy)


def test_the_same_average_of_two_methods_runs_of_one_setting_is_labelled_with_the_run_it_averages(tmp_path):
    """An SGD and an EMA run of one setting train the same live weights; each one's lawa2 is a column of its own,
    named after the run it averages, in the one row of that setting (not a second row under the same label)."""
    runs = {method: tmp_path / method for method in ("sgd", "ema")}
    for method, run in runs.items():
        train(make_cfg(f"method={method}", "run.snapshots=1"), run_dir=run)
        main([str(run), "--lawa", "2"])
    table = report(list(runs.values()), tmp_path / "report")["table"]
    assert len(table.rows) == 1
    lawa = {c.label: c for c in table.columns if c.posthoc}
    assert set(lawa) == {"lawa2 of SGD 1B (4 ep)", "lawa2 of EMA 1B (4 ep)"}
    for label, column in lawa.items():
        (entry,) = table.rows[0].cells[column].entries
        assert entry.run.path == runs[entry.run.method] and f"of {entry.run.method.upper()} " in label


# -- EDM2's power EMA, rebuilt from the snapshots of two tracked widths --------------------------------------------
POWER = ["run.snapshots=0.25", "run.powerema=[0.05,0.10]", "dataset.val_size=100"]  # a snapshot every step: 16
# The rebuild at a tracked width is its last snapshot: the solve gives it weight 1 and the others 5e-17 at most, so
# the rebuilt weights equal the stored ones to float32 rounding (measured: identical, max |difference| 0). At 0.07,
# between the tracked widths, the rebuild over these 16 steps is 5.7e-5 of what averaging moved (|rebuilt - direct| /
# |direct - live weights|, parameters only) from an EMA of 0.07 tracked directly (profile error 3.8e-3); the tracked
# widths themselves are 0.43 and 0.69 from it.
POWER_TRACKED_TOL = 1e-6
POWER_OTHER_TOL = 5e-4


@pytest.fixture(scope="module")
def power_runs(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny run tracking 0.05 and 0.10, and the same run (bit-equal training: one thread) tracking 0.07."""
    root = tmp_path_factory.mktemp("powerema")
    train(make_cfg(*POWER), run_dir=root / "two")
    train(make_cfg(*POWER[:1], "run.powerema=[0.07]", *POWER[2:]), run_dir=root / "direct")
    return root / "two", root / "direct"


def power_distance(rebuilt: dict, direct: dict, live: dict) -> float:
    """|rebuilt - direct| / |direct - live| over the parameters (BN statistics are recomputed on every side)."""
    keys = [k for k in direct if direct[k].is_floating_point() and not k.endswith(("running_mean", "running_var"))]
    num = sum(float((rebuilt[k].double() - direct[k].double()).pow(2).sum()) for k in keys)
    den = sum(float((direct[k].double() - live[k].double()).pow(2).sum()) for k in keys)
    return (num / den) ** 0.5


def test_the_power_ema_rebuilt_at_a_tracked_width_is_that_tracked_ema(power_runs):
    from swalab.posthoc import power_ema, power_snapshots

    found = power_snapshots(power_runs[0])
    assert len(found) == 16 and found[-1].t == 16
    label, rebuilt, built_from, info = power_ema(found, 0.10)
    tracked = found[-1].averages()["0.10"]
    assert label == "powerema0.10" and len(built_from) == 16 and info["profile_error"] < 1e-6
    for key, value in tracked.items():
        assert torch.allclose(rebuilt[key], value, rtol=0, atol=POWER_TRACKED_TOL), key


def test_the_power_ema_rebuilt_at_another_width_matches_an_ema_of_that_width_tracked_directly(power_runs):
    from swalab.posthoc import power_ema, power_snapshots

    two, direct_run = power_runs
    _, rebuilt, _, info = power_ema(power_snapshots(two), 0.07)
    last = torch.load(direct_run / "snapshots" / "epoch0004.pt", weights_only=True)
    direct, live = last["powerema"]["averages"]["0.07"], last["model"]
    assert power_distance(rebuilt, direct, live) < POWER_OTHER_TOL
    nearest = min(power_distance(torch.load(two / "snapshots" / "epoch0004.pt", weights_only=True)["powerema"]
                                 ["averages"][w], direct, live) for w in ("0.05", "0.10"))
    assert nearest > 100 * POWER_OTHER_TOL  # no trivial pick of a tracked width


def test_the_power_ema_is_scored_and_labelled_with_its_width(power_runs):
    two, _ = power_runs
    main([str(two), "--powerema", "0.07", "0.10"])
    metrics = posthoc_metrics(two, "powerema0.10")
    assert set(metrics) == {"powerema0.10", "powerema0.10+ts"}
    described = metrics["powerema0.10"]["powerema"]
    assert described["t"] == 16 and described["from_sigma_rels"] == [0.05, 0.10]
    assert {"acc", "nll", "val"} <= set(posthoc_metrics(two, "powerema0.07")["powerema0.07"])


def test_a_power_ema_of_a_run_that_tracked_none_or_of_a_width_out_of_range_is_refused(swa_run, power_runs):
    with pytest.raises(PosthocError, match=r"--powerema 0.1: .* tracked no power EMA; train with run.powerema.*"
                                           r"run.dir=<dir>.*its own command skips it"):  # neither key names a run
        main([str(swa_run), "--powerema", "0.1"])
    with pytest.raises(PosthocError, match=r"^--powerema 0.5: width 0.5 is out of range; .* e.g. --powerema 0.05 0.1 "):
        main([str(power_runs[0]), "--powerema", "0.5"])


def test_the_figure_draws_each_family_against_its_knob_with_the_online_marks_and_rings_the_choice(monkeypatch, tmp_path):
    from swalab.posthoc import Result
    from swalab.posthoc import figure

    drawn = {}
    monkeypatch.setattr(figure.style, "finish", lambda plt, fig, path: drawn.setdefault("fig", fig))
    m = lambda acc, nll: {"acc": acc, "nll": nll, "val": {"acc": acc - 1, "nll": nll + 0.1}}  # noqa: E731
    results = [Result(f"powerema{s}", "powerema", float(s), tmp_path, {f"powerema{s}": m(90 + i, 0.3 - i / 100)})
               for i, s in enumerate(("0.05", "0.10", "0.15"))]
    online = {"swa (swa run, seed 0)": m(91, 0.31), "ema (ema run, seed 0)": m(90.5, 0.33), "sgd (sgd run, seed 0)":
              m(89, 0.4)}
    assert figure.plot(results, online, tmp_path / "f.png", chosen=["powerema0.10"])
    acc, nll = drawn["fig"].axes[:2]
    assert acc.get_xlabel().startswith("sigma_rel")
    labels = [line.get_label() for line in nll.get_lines()]
    assert labels[:3] == ["post-hoc powerema, test", "post-hoc powerema, validation",
                          "chosen on validation (its test score)"]
    assert {"online swa (swa run, seed 0), test", "online ema (ema run, seed 0), validation",
            "online sgd (sgd run, seed 0), test"} <= set(labels)
    ring = nll.get_lines()[2]
    assert list(ring.get_xdata()) == [0.10] and list(ring.get_ydata()) == [pytest.approx(0.29)]


def test_marks_of_two_runs_of_one_method_and_seed_are_told_apart_in_the_legend_and_the_colour(monkeypatch, tmp_path):
    """--mark <fine-tune> <its start>: both are 'sgd run, seed 0'. Each keeps its line, named by what sets it apart
    (one name for both kept only the last, and the legend said nothing of which), in shades of SGD's colour."""
    from test_report import m as metrics, make_run, with_apart

    from swalab import style
    from swalab.posthoc import figure

    start = with_apart(make_run(tmp_path, "sgd", 0, {"sgd": metrics(74.0)}, name="start"), {"trainer.epochs": 4})
    tuned = with_apart(make_run(tmp_path, "sgd", 0, {"sgd": metrics(86.0)}, name="tuned",
                                extra={"model": {"init_from": "run-abc", "lr": 0.01}}),
                       {"model.init_from": "run-abc", "model.lr": 0.01, "trainer.epochs": 4})
    online = online_of([str(tuned), str(start)])
    assert online == {"sgd (sgd run, seed 0, model.init_from=run-abc, model.lr=0.01)": metrics(86.0),
                      "sgd (sgd run, seed 0, model.init_from, model.lr at the defaults)": metrics(74.0)}
    drawn = {}
    monkeypatch.setattr(figure.style, "finish", lambda plt, fig, path: drawn.setdefault("fig", fig))
    results = [type("R", (), {"family": "ema", "knob": k, "label": f"ema{k}", "built_from": [], "run": tmp_path,
                              "metrics": {f"ema{k}": metrics(80.0)}})() for k in (0.5, 0.9)]
    assert figure.plot(results, online, tmp_path / "f.png")
    marks = [line for line in drawn["fig"].axes[0].get_lines() if line.get_label().startswith("online")]
    assert len(marks) == 2 and len({line.get_color() for line in marks}) == 2
    assert {style.to_hex(line.get_color()) for line in marks} == {style.color_of("sgd"), style.color_of("sgd", 2)}


def test_a_mark_the_figure_cannot_draw_is_refused_naming_it_before_anything_is_built(swa_run, tmp_path):
    """--mark <a typo>, or a run that has not finished: the figure drew no line for it and nothing said so."""
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((swa_run / "config.yaml").read_text())
    for mark, why in ((tmp_path / "no-such-run", "is not a swalab run directory"), (unfinished, "has not finished")):
        with pytest.raises(ConfigError, match=rf"^--mark: {re.escape(str(mark))} {why}"):
            main([str(swa_run), "--ema", "0.55", "--mark", str(mark)])
    assert not (swa_run / "posthoc" / "ema0.55").exists()


def test_a_swa_window_ending_before_the_last_snapshot_is_drawn_apart_from_the_curve_named(monkeypatch, tmp_path):
    """swa[25:30] (an online budget mark's window) starts where swa[25:45] does: on the curve against the start it would
    read as the same knob; it is drawn apart, with its label beside it."""
    from swalab.posthoc import Result
    from swalab.posthoc import figure

    drawn = {}
    monkeypatch.setattr(figure.style, "finish", lambda plt, fig, path: drawn.setdefault("fig", fig))
    m = lambda acc: {"acc": acc, "nll": 1.0 - acc / 100}  # noqa: E731
    snaps = lambda a, b: [f"snapshots/epoch{e:04d}.pt" for e in range(a, b + 1)]  # noqa: E731
    results = [Result(f"swa[{a}:{b}]", "swa", float(a), tmp_path, {f"swa[{a}:{b}]": m(acc)}, snaps(a, b))
               for a, b, acc in ((20, 45, 78.0), (25, 45, 77.8), (25, 30, 77.7), (30, 45, 77.6))]
    assert figure.plot(results, {}, tmp_path / "f.png", chosen=["swa[25:30]"])
    acc = drawn["fig"].axes[0]
    curve = acc.get_lines()[0]
    assert list(curve.get_xdata()) == [20.0, 25.0, 30.0] and list(curve.get_ydata()) == [78.0, 77.8, 77.6]
    assert [t.get_text() for t in acc.texts] == ["swa[25:30]"]
    ring = next(line for line in acc.get_lines() if line.get_label() == "chosen on validation (its test score)")
    assert list(ring.get_ydata()) == [77.7]


def test_the_uniform_and_the_greedy_soup_are_two_named_points_not_one_curve(monkeypatch, tmp_path):
    """Against the ingredients kept, soup-uniform(3) (x = 3) and soup-greedy(3) that kept one (x = 1) were joined by
    one line, as if one soup had been swept over its size, and nothing said which point was which."""
    from swalab.posthoc import Result
    from swalab.posthoc import figure

    drawn = {}
    monkeypatch.setattr(figure.style, "finish", lambda plt, fig, path: drawn.setdefault("fig", fig))
    val = {"val": {"acc": 80.0, "nll": 0.5}}
    results = [Result("soup-uniform(3)", "soup", 3.0, tmp_path, {"soup-uniform(3)": {"acc": 78.0, "nll": 0.6, **val}}),
               Result("soup-greedy(3)", "soup", 1.0, tmp_path, {"soup-greedy(3)": {"acc": 77.0, "nll": 0.7, **val}})]
    assert figure.plot(results, {}, tmp_path / "f.png")
    acc = drawn["fig"].axes[0]
    assert not any(len(line.get_xdata()) > 1 for line in acc.get_lines())
    assert sorted(t.get_text() for t in acc.texts) == ["soup-greedy(3)", "soup-uniform(3)"]
    assert [line.get_label() for line in acc.get_lines() if line.get_label().startswith("post-hoc")] == [
        "post-hoc soup (named), test"]


def test_wiseft_of_a_timm_fine_tune_starts_from_its_pretrained_weights(make_cfg, tiny_imagenet, tmp_path):
    """A timm network fine-tuned from its pretrained weights (model.pretrained_file here, the hub's alike) has no
    model.init_from: its start is the weights the network was built with, a 1000-way head included. With the BN
    statistics interpolated (--wiseft-bn interpolate) alpha 0 and 1 are the pretrained network and the fine-tune as
    their runs scored them; recomputed over the fine-tune's training data they are other networks."""
    weights = tmp_path / "weights.pth"
    pretrained = create_timm_model("test_resnet").state_dict()
    torch.save(pretrained, weights)
    tuned, scored = tmp_path / "tuned", tmp_path / "pretrained"
    train(tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={weights}", "method=sgd", "trainer.epochs=1",
                   "run.eval_every=0"), run_dir=tuned)
    train(tiny_run(make_cfg, tiny_imagenet, f"model.pretrained_file={weights}", "method=pretrained"), run_dir=scored)
    start, source = start_weights(score_run(tuned, device="cpu"))
    assert source == str(weights) and start.keys() == pretrained.keys()
    assert all(torch.equal(start[k], v) for k, v in pretrained.items())
    main([str(tuned), "--wiseft", "0", "1", "--wiseft-bn", "recompute", "interpolate", "--mark", str(tuned),
          str(scored)])
    assert posthoc_metrics(tuned, "wiseft0")["wiseft0"]["built_from"] == [str(weights), "final.pt"]
    online = {"wiseft0[bn-interp]": json.loads((scored / "metrics.json").read_text())["pretrained"],
              "wiseft1[bn-interp]": json.loads((tuned / "metrics.json").read_text())["sgd"]}
    for label, expected in online.items():
        got = posthoc_metrics(tuned, folder_name(label))[label]
        assert got["bn"] == "interpolated" and got["acc"] == expected["acc"], label
        assert got["nll"] == pytest.approx(expected["nll"], abs=METRIC_TOL), label
    assert posthoc_metrics(tuned, "wiseft0")["wiseft0"]["bn"] == "recomputed"
    assert (tuned / "posthoc" / "posthoc.png").is_file()
    assert set(online_of([str(tuned), str(scored)])) == {"sgd (sgd run, seed 0)", "pretrained (pretrained run, seed 0)"}


def test_wiseft_is_refused_for_a_timm_run_whose_head_was_initialised_at_random(make_cfg, tmp_path):
    weights = tmp_path / "weights.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), weights)  # 1000 classes; the digits have 10
    tuned = tmp_path / "digits"
    train(make_cfg("model=timm", "model.name=test_resnet", f"model.pretrained_file={weights}", "method=sgd",
                   "trainer.epochs=1", "dataset.train_size=64", "trainer.batch_size=32", "run.eval_every=0"),
          run_dir=tuned)
    with pytest.raises(PosthocError, match="--wiseft: .*head of 1000 classes re-initialised at random for 10"):
        main([str(tuned), "--wiseft", "0.5"])


def test_wiseft_is_refused_for_a_timm_run_on_an_image_folder_with_a_random_head(make_cfg, tmp_path):
    """dataset=folder leaves dataset.num_classes null (the folders say it): the start is built for the run's 3 classes,
    so the refusal comes, not a shape mismatch in the middle of the interpolation."""
    from test_folder_data import write_folder

    weights = tmp_path / "weights.pth"
    torch.save(create_timm_model("test_resnet").state_dict(), weights)
    root = write_folder(tmp_path / "data", ["a", "b", "c"], n_train=6, n_test=3, size=(8, 8))
    tuned = tmp_path / "folder"
    train(make_cfg("dataset=folder", f"dataset.root={root}", f"run.cache_dir={tmp_path / 'cache'}", "model=timm",
                   "model.name=test_resnet", f"model.pretrained_file={weights}", "method=sgd", "trainer.epochs=1",
                   "trainer.batch_size=6", "run.eval_every=0"), run_dir=tuned)
    with pytest.raises(PosthocError, match="--wiseft: .*head of 1000 classes re-initialised at random for 3"):
        main([str(tuned), "--wiseft", "0.5"])


# -- an average is what it was built from; the figure draws every average of the run ---------------------------------

@pytest.fixture
def copied_run(swa_run, tmp_path) -> Path:
    """The SWA run copied without its averages (a copy keeps every average's files the same: its averages stay
    current)."""
    import shutil

    run = tmp_path / "copy" / "swa"
    shutil.copytree(swa_run, run, ignore=shutil.ignore_patterns("posthoc", "scores"))
    return run


def drawn_labels(monkeypatch) -> dict:
    """What the next ``posthoc`` call's figure draws: ``{"labels": [...], "knobs": {label: knob}}``."""
    from swalab.posthoc import __main__ as command

    drawn: dict = {}

    def plot(results, online, path, title="", chosen=()):
        drawn.update(labels=sorted(r.label for r in results), knobs={r.label: r.knob for r in results})
        return True

    monkeypatch.setattr(command, "plot", plot)
    return drawn


def test_an_average_whose_snapshots_were_removed_after_it_was_built_stays_in_the_report(copied_run, tmp_path):
    import shutil

    main([str(copied_run), "--lawa", "2"])
    shutil.rmtree(copied_run / "snapshots")  # disk freed once the averages are built
    found = report([copied_run], tmp_path / "after")
    table, _, notes = (tmp_path / "after" / "table.md").read_text().partition("## Not in the table")
    assert "lawa2" in {c.method for c in found["table"].columns} and "stale" not in notes


def test_an_average_whose_snapshots_changed_after_it_was_built_is_left_out_of_the_report_naming_the_command_that_rebuilds_it(
        copied_run, tmp_path, monkeypatch, capsys):
    import shutil

    main([str(copied_run), "--lawa", "2"])
    report([copied_run], tmp_path / "before")
    assert "lawa2" in (tmp_path / "before" / "table.md").read_text()  # current, a column of its run

    # as if the run had trained again (a damaged metrics.json, more epochs): its last snapshot holds other weights now
    shutil.copy(copied_run / "snapshots" / "epoch0003.pt", copied_run / "snapshots" / "epoch0004.pt")
    found = report([copied_run], tmp_path / "after")
    table, _, notes = (tmp_path / "after" / "table.md").read_text().partition("## Not in the table")
    assert "lawa2" not in table and "lawa2" not in {c.method for c in found["table"].columns}
    rebuild = f"python -m swalab.posthoc {copied_run} --lawa 2"
    stale = [line for line in notes.splitlines() if "posthoc/lawa2" in line]
    assert len(stale) == 1 and "snapshots/epoch0004.pt" in stale[0] and stale[0].endswith(rebuild), stale

    drawn = drawn_labels(monkeypatch)
    capsys.readouterr()
    main([str(copied_run), "--ema", "0.5"])  # a later call says so too, and neither draws nor chooses it
    assert rebuild in capsys.readouterr().out
    assert drawn["labels"] == ["ema0.5"]

    main([str(copied_run), "--lawa", "2"])  # built again from today's files: current again
    report([copied_run], tmp_path / "rebuilt")
    table, _, notes = (tmp_path / "rebuilt" / "table.md").read_text().partition("## Not in the table")
    assert "lawa2" in table and "posthoc/lawa2" not in notes


def test_an_average_asked_again_from_unchanged_files_is_kept_and_built_again_once_they_changed(copied_run, capsys):
    import shutil

    record = copied_run / "posthoc" / "lawa2" / "metrics.json"
    main([str(copied_run), "--lawa", "2"])
    built = record.stat().st_mtime_ns
    capsys.readouterr()

    main([str(copied_run), "--lawa", "2", "--ema", "0.5"])  # the same request again, and a new one
    out = capsys.readouterr().out
    kept = [line for line in out.splitlines() if "lawa2" in line]
    assert len(kept) == 1 and "kept, built before from the same files (--again builds it again)" in kept[0], out
    assert record.stat().st_mtime_ns == built and (copied_run / "posthoc" / "ema0.5" / "metrics.json").exists()

    main([str(copied_run), "--lawa", "2", "--again"])  # asked to: built again
    assert "kept" not in capsys.readouterr().out and record.stat().st_mtime_ns != built
    built = record.stat().st_mtime_ns

    shutil.copy(copied_run / "snapshots" / "epoch0003.pt", copied_run / "snapshots" / "epoch0004.pt")  # rewritten
    main([str(copied_run), "--lawa", "2"])
    assert "kept" not in capsys.readouterr().out and record.stat().st_mtime_ns != built
    assert json.loads(record.read_text())["lawa2"]["sources"]["snapshots/epoch0004.pt"] == \
        file_fingerprint(copied_run / "snapshots" / "epoch0003.pt")


def test_a_second_posthoc_call_draws_the_averages_of_the_first_beside_its_own(copied_run, monkeypatch):
    drawn = drawn_labels(monkeypatch)
    main([str(copied_run), "--lawa", "2", "3"])
    main([str(copied_run), "--ema", "0.5"])
    assert drawn["labels"] == ["ema0.5", "lawa2", "lawa3"]
    assert drawn["knobs"]["lawa2"] == 2.0 and drawn["knobs"]["lawa3"] == 3.0 and drawn["knobs"]["ema0.5"] == 0.5


def test_a_second_posthoc_on_a_run_another_process_averages_is_refused_in_one_line_naming_it(copied_run, capsys):
    import fcntl
    import os

    from swalab.cli import run_command
    from swalab.runlock import LOCK_FILE

    (copied_run / "posthoc").mkdir(exist_ok=True)
    fd = os.open(copied_run / "posthoc" / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.pwrite(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": 0}).encode(), 0)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: this process's own flock is refused too
    try:
        with pytest.raises(SystemExit) as exited:
            run_command(main, [str(copied_run), "--lawa", "2"], prog="swalab.posthoc")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "posthoc is being averaged by another process (PID 4242 on host elsewhere" in err[0], err
    assert not (copied_run / "posthoc" / "lawa2").exists()


def test_posthoc_given_a_directory_that_is_no_run_makes_nothing_there(swa_run, tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(FileNotFoundError, match="is not a swalab run directory"):
        main([str(swa_run), str(tmp_path / "notes"), "--lawa", "2"])
    assert list((tmp_path / "notes").iterdir()) == []


def test_posthoc_interrupted_by_ctrl_c_says_so_in_one_line_and_keeps_each_average_whole_or_absent(copied_run):
    """Ctrl-C while the second average is written (its predictions, not yet its metrics.json): one line, exit 130,
    the first average whole, the second without a record, which the same command builds again."""
    import os
    import signal
    import subprocess
    import sys

    from swalab import faults

    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, "OMP_NUM_THREADS": "1",
           faults.ENV: "record_commit:2:INT"}
    done = subprocess.run([sys.executable, "-m", "swalab.posthoc", str(copied_run), "--lawa", "2", "3", "--device",
                           "cpu"], env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert (copied_run / "posthoc" / "lawa2" / "metrics.json").exists()
    assert not (copied_run / "posthoc" / "lawa3" / "metrics.json").exists()


def posthoc_cli(run: Path, *args: str, fault: str) -> "subprocess.CompletedProcess":
    """``python -m swalab.posthoc <run> <args> --device cpu`` in a child process with a planned fault
    (``swalab.faults``)."""
    import os
    import subprocess
    import sys

    from swalab import faults

    env = {**{k: v for k, v in os.environ.items() if k != faults.ENV}, "OMP_NUM_THREADS": "1", faults.ENV: fault}
    return subprocess.run([sys.executable, "-m", "swalab.posthoc", str(run), *args, "--device", "cpu"], env=env,
                          capture_output=True, text=True, timeout=300)


def test_posthoc_stopped_by_sigterm_says_so_in_one_line_like_ctrl_c_and_keeps_each_average_whole_or_absent(copied_run):
    """``kill`` (a job's time limit) while the second average is written: one line, exit 143 (128 + SIGTERM), the
    first average whole, the second without a record."""
    done = posthoc_cli(copied_run, "--lawa", "2", "3", fault="record_commit:2:TERM")
    assert done.returncode == 143, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "builds the averages asked again" in lines[0], done.stderr
    assert (copied_run / "posthoc" / "lawa2" / "metrics.json").exists()
    assert not (copied_run / "posthoc" / "lawa3" / "metrics.json").exists()


def test_posthoc_stopped_by_sigterm_before_it_wrote_anything_leaves_no_posthoc_folder(copied_run):
    """SIGTERM once ``posthoc/`` is locked, before any average is written: the folder the lock made is removed again,
    as after Ctrl-C, so no empty ``posthoc/`` holding only ``.lock`` is left in the run."""
    done = posthoc_cli(copied_run, "--lawa", "2", fault="folders_held:1:TERM")
    assert done.returncode == 143, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (copied_run / "posthoc").exists()


def test_a_posthoc_folder_left_by_kill_9_holding_only_its_lock_troubles_neither_the_next_call_nor_the_run(copied_run):
    """``kill -9`` runs no clean-up, so ``posthoc/.lock`` stays; the run reads no average from it, and the same
    command takes the lock over and builds the average whole."""
    from swalab.results.runs import Run

    killed = posthoc_cli(copied_run, "--lawa", "2", fault="folders_held:1:KILL")
    assert killed.returncode == -9, killed.stderr
    assert [p.name for p in (copied_run / "posthoc").iterdir()] == [".lock"]
    assert Run(copied_run).posthoc == {}
    main([str(copied_run), "--lawa", "2"])
    assert "lawa2" in Run(copied_run).posthoc


def test_a_second_call_with_select_chooses_in_every_family_it_draws_those_of_earlier_calls_too(copied_run, capsys):
    """The figure of a call draws every current average of the run; its rings and the choice lines cover them all,
    not only the families this call built."""
    main([str(copied_run), "--lawa", "2", "3"])
    capsys.readouterr()
    main([str(copied_run), "--ema", "0.5", "--select", "val"])
    out = capsys.readouterr().out
    assert "of ema for" in out
    assert re.search(r"chosen on validation nll: lawa[23] .* of lawa for .*, built by an earlier call", out), out


def test_a_swa_window_ending_after_the_run_is_refused_naming_its_last_epoch(swa_run):
    """``--swa 2:9`` of a run of 4 epochs averaged epochs 2 to 4 and was labelled ``swa[2:9]``: a window that never
    ran, and a second column beside ``swa[2:4]``, the same average."""
    with pytest.raises(PosthocError, match=r"^--swa 2:9: the run ends at epoch 4: give --swa 2:4 or --swa 2: "):
        main([str(swa_run), "--swa", "2:9"])
    assert not (swa_run / "posthoc" / "swa_2-9").exists()


def test_a_swa_window_is_labelled_by_the_snapshots_it_averages(copied_run, capsys):
    """``--swa 0:3`` of a run whose first snapshot is epoch 1 averaged epochs 1 to 3 and was labelled ``swa[0:3]``:
    an epoch 0 it never read, and a second column beside ``swa[1:3]``, the same average."""
    main([str(copied_run), "--swa", "0:3", "1:3"])
    assert "swa[1:3]" in capsys.readouterr().out
    assert sorted(p.name for p in (copied_run / "posthoc").iterdir() if p.is_dir()) == ["swa_1-3"]
    built_from = posthoc_metrics(copied_run, "swa_1-3")["swa[1:3]"]["built_from"]
    assert built_from == ["epoch0001.pt", "epoch0002.pt", "epoch0003.pt"]


def refusal_of_window(run, capsys) -> list[str]:
    """What ``python -m swalab.posthoc <run> --swa 1:3`` prints on stderr when it refuses (asserted: exit 2)."""
    from swalab.cli import run_command

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_command(main, [str(run), "--swa", "1:3"], prog="swalab.posthoc")
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_snapshot_holding_nan_is_named_in_one_line_and_nothing_is_built_of_it(copied_run, capsys):
    """A snapshot whose weights hold NaN made every average of it NaN (accuracy at chance, NLL nan), written and
    exit 0; it is said in one line naming the file and the tensor (exit 2), and the averages written before stay."""
    main([str(copied_run), "--lawa", "2"])
    snapshot = copied_run / "snapshots" / "epoch0002.pt"
    saved = torch.load(snapshot, weights_only=True)
    name = next(k for k, t in saved["model"].items() if t.is_floating_point())
    saved["model"][name].view(-1)[0] = float("nan")
    torch.save(saved, snapshot)
    err = refusal_of_window(copied_run, capsys)
    assert len(err) == 1 and f"{snapshot}: {name} holds NaN or Inf" in err[0], err
    assert not (copied_run / "posthoc" / "swa_1-3").exists()
    assert (copied_run / "posthoc" / "lawa2" / "metrics.json").exists()


def test_a_file_given_for_the_run_is_named_as_a_file_not_as_the_figure(tmp_path):
    """A file given where the run directory goes was refused as ``--figure <file>/posthoc/posthoc.png lies below
    <file>, which is a file``: an option never typed."""
    config = tmp_path / "config.yaml"
    config.write_text("seed: 0\n")
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(config))} is not a swalab run directory: it is a "
                                                r"file; give the folder of a run$"):
        main([str(config), "--lawa", "2"])


def test_a_snapshot_cut_short_is_named_in_one_line_and_the_averages_built_before_stay(copied_run, capsys):
    """A snapshot a full disk or a copy cut short is said in one line naming it (exit 2), as an unreadable
    ``final.pt`` is, and the averages written before stay whole."""
    main([str(copied_run), "--lawa", "2"])
    snapshot = copied_run / "snapshots" / "epoch0002.pt"
    snapshot.write_bytes(snapshot.read_bytes()[:2000])
    err = refusal_of_window(copied_run, capsys)
    assert len(err) == 1 and f"{snapshot}: cannot read it" in err[0], err
    assert (copied_run / "posthoc" / "lawa2" / "metrics.json").exists()
