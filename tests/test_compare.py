"""``swalab.results.compare.score_run`` (over ``swalab.results.runs.open_run``) and ``python -m swalab.results.compare`` on two tiny
finished runs (SWA and FGE)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from swalab.results.compare import compare, main, score_run
from swalab.evaluate import metrics_from_log_probs
from swalab.results.runs import open_run
from swalab.runweights import load_weights

TINY = ["dataset.train_size=64", "trainer.batch_size=32", "run.eval_every=0", "trainer.epochs=6"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import train_on_one_thread

    root = tmp_path_factory.mktemp("runs")
    return (train_on_one_thread(root / "swa", *TINY, "method=swa", "model.swa.start_epoch=4",
                                "run.keep_finished_checkpoints=true"),  # copied as if still training
            train_on_one_thread(root / "fge", *TINY, "method=fge", "model.fge.pretrain_epochs=2",
                                "model.fge.save_members=true"))


def test_a_run_reopens_with_its_model_weights_and_loaders(runs):
    scored = score_run(runs[0], device="cpu")
    final = torch.load(runs[0] / "final.pt", weights_only=False)
    for key, value in scored.model.state_dict().items():
        assert torch.equal(value, final["model"][key]), key
    run = open_run(runs[0])
    swa = scored.model_for(run.weights("swa"), "swa")
    for key, value in swa.state_dict().items():
        assert torch.equal(value, final["methods"]["swa"][key]), key
    assert run.method == "swa" and len(scored.test_labels()) == 360 and run.method_weights() == ["swa"]
    metrics = metrics_from_log_probs(scored.log_probs(swa), scored.test_labels())
    assert metrics["acc"] == pytest.approx(run.metrics["swa"]["acc"], abs=1e-6)
    assert metrics["nll"] == pytest.approx(run.metrics["swa"]["nll"], abs=1e-6)
    with pytest.raises(ValueError, match="ema"):  # swalab.config.ConfigError: the user's to fix, said in one line
        run.weights("ema")
    assert all(torch.equal(load_weights(f"{runs[0]}:swa")[k], v) for k, v in final["methods"]["swa"].items())


@pytest.mark.slow
def test_compare_scores_every_predictor_like_training_did(runs):
    result = compare(runs, device="cpu")
    table = result["predictors"]
    assert set(table) == {"swa/seed0/sgd", "swa/seed0/swa", "fge/seed0/fge", "fge/seed0/fge_avg"}
    swa_metrics = json.loads((runs[0] / "metrics.json").read_text())
    fge_metrics = json.loads((runs[1] / "metrics.json").read_text())
    for key in ("acc", "nll", "ece"):
        assert table["swa/seed0/swa"][key] == pytest.approx(swa_metrics["swa"][key], abs=1e-5)
        assert table["swa/seed0/sgd"][key] == pytest.approx(swa_metrics["sgd"][key], abs=1e-5)
        assert table["fge/seed0/fge"][key] == pytest.approx(fge_metrics["fge"][key], abs=1e-5)
    diag = result["section35"]["fge/seed0/fge"]
    assert diag["members"] == 2 and diag["consecutive"]["pairs"][0]["members"] == [1, 2]
    assert set(diag["vs_ensemble"]) == {"fge/seed0/fge_avg", "swa/seed0/swa"}
    for pair in diag["vs_ensemble"].values():
        assert 0 <= pair["l2"] <= 2 ** 0.5 and 0 <= pair["agreement"] <= 100


def test_compare_falls_back_to_cached_member_probs_and_writes_json(runs, tmp_path, capsys):
    fge_dir = tmp_path / "fge"
    import shutil

    shutil.copytree(runs[1], fge_dir)
    shutil.rmtree(fge_dir / "members")
    out = tmp_path / "cmp.json"
    result = main([str(fge_dir), "--out", str(out), "--device", "cpu"])
    assert set(result["predictors"]) == {"fge/seed0/fge"}
    assert json.loads(out.read_text())["predictors"] == result["predictors"]
    printed = capsys.readouterr().out
    assert "consecutive members" in printed and "fge/seed0/fge" in printed


def test_compare_without_out_writes_no_file(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main([str(runs[1]), "--device", "cpu"])
    assert "fge/seed0/fge" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # printed only: no ./compare.json in whatever directory it ran from


@pytest.mark.parametrize("command", [["swalab.results.compare", "not_a_run"],
                                     ["swalab.analysis", "segment", "--run", "not_a_run", "--out", "seg"]])
def test_a_path_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, command):
    done = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"[{command[0]}] not_a_run is not a swalab run directory: "
                                                "no such directory"]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_an_outputs_folder_given_for_a_run_is_one_line_naming_a_run_below_it(tmp_path):
    run = tmp_path / "outputs" / "digits" / "preresnet20" / "sgd" / "default" / "seed0"
    run.mkdir(parents=True)
    (run / "identity.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    for folder, why in (("outputs", f"it holds runs below it: give one of them, e.g. {run.relative_to(tmp_path)}"),
                        ("notes", "no config.yaml there"),
                        (str(run.relative_to(tmp_path)), "no config.yaml there")):  # a run that lost its config
        done = subprocess.run([sys.executable, "-m", "swalab.results.compare", folder], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [f"[swalab.results.compare] {folder} is not a swalab run directory: "
                                                    f"{why}"]


@pytest.mark.parametrize("args, line", [
    (["--device", "cuda"], "--device cuda: no such device here"),
    (["--out", "afile/x.json"], "--out afile/x.json lies below afile, which is a file"),
])
def test_bad_flags_are_one_line_before_any_scoring(runs, tmp_path, args, line):
    if args[0] == "--device" and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    (tmp_path / "afile").write_text("")
    done = subprocess.run([sys.executable, "-m", "swalab.results.compare", str(runs[0]), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"[swalab.results.compare] {line}")


def test_compare_refuses_a_run_that_has_not_finished(runs, tmp_path):
    import shutil

    copy = tmp_path / "swa"
    shutil.copytree(runs[0], copy)
    (copy / "metrics.json").unlink()  # as while it still trains
    with pytest.raises(FileNotFoundError, match=r"has not finished \(its newest kept checkpoint is epoch 6 of 6[;)]") as why:
        compare([copy], device="cpu")
    assert "@" not in str(why.value).replace(str(copy), "")  # compare scores whole runs: it offers no <run dir>@<epoch>
    (copy / "metrics.json").write_text("")  # damaged
    with pytest.raises(FileNotFoundError, match=r"metrics.json cannot be read"):
        compare([copy], device="cpu")


def fake_run(path, method="swa", seed=0, dataset="digits", epochs=8, apart=None):
    import yaml

    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "dataset": {"name": dataset},
                                                      "method": {"name": method}, "trainer": {"epochs": epochs}}))
    (path / "identity.json").write_text(json.dumps({"identity": {"seed": seed}, **({"apart": apart} if apart else {})}))
    return path


def test_compare_labels_runs_by_what_sets_them_apart_and_says_what_differs(tmp_path):
    from types import SimpleNamespace

    from swalab.results.compare import differences_between, unique_labels
    from swalab.results.runs import Run

    runs = [SimpleNamespace(run=Run(fake_run(tmp_path / name, **kw))) for name, kw in [
        ("a", {"apart": {"model.swa.lr": 0.05}}), ("b", {}), ("c", {"dataset": "cifar10", "epochs": 30}),
        ("d", {})]]
    assert unique_labels(runs) == ["swa/seed0[model.swa.lr=0.05]",  # not swa/seed0 and swa/seed0#2
                                   f"swa/seed0[{tmp_path / 'b'}]", f"swa/seed0[{tmp_path / 'c'}]",
                                   f"swa/seed0[{tmp_path / 'd'}]"]  # alike by their settings: told apart by place
    labels = [torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([1, 1, 0]), torch.tensor([0, 1])]
    notes = differences_between(runs, labels)
    assert notes == ["the runs are on different data sets (cifar10, digits): their numbers are not comparable",
                     "the runs were scored on different test sets (other images or test_size): their numbers are "
                     "not comparable, and no section 3.5 pair crosses them",
                     "the runs trained for different lengths (8, 30 epochs)"]
