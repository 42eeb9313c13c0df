"""Every command-line tool refuses what it cannot do in one line (exit 2) and writes nothing: a mandatory key left
unset, a run whose weights are another model's or cut short, a full disk, a path the file system cannot hold, a
setting out of what its owner takes (issue 44)."""

from __future__ import annotations

import errno
import os
import runpy
import sys
import re
import shutil
from pathlib import Path

import pytest

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.cli import run_command

REPO = Path(__file__).resolve().parents[1]
TINY = ["logger=none", "run.progress=false", "dataset.train_size=128", "trainer.batch_size=64"]


def refused(capsys, main, argv, prog="tool") -> str:
    """What ``main(argv)`` says when it refuses: one line on stderr, exit 2."""
    with pytest.raises(SystemExit) as exit_:
        run_command(main, argv, prog=prog)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


# -- the row tool checks what run.py checks -------------------------------------------------------------------
@pytest.mark.parametrize("dataset, model, key", [("folder", "preresnet20", "dataset.root"),
                                                 ("digits", "custom", "model.arch._target_")])
def test_a_row_without_a_mandatory_key_is_refused_in_one_line_naming_it_and_writes_nothing(
        tmp_path, capsys, dataset, model, key):
    from swalab.results.row import main

    out = tmp_path / "out"
    err = refused(capsys, main, ["--dataset", dataset, "--model", model, "--dry-run", *TINY,
                                 f"paths.output_dir={out}"], prog="swalab.results.row")
    assert f"{key} is required: set {key}=" in err
    assert not out.exists()


def test_a_row_refuses_a_bad_value_as_run_py_does_before_its_first_job(tmp_path, capsys):
    from swalab.results.row import main

    out = tmp_path / "out"
    err = refused(capsys, main, ["--dataset", "digits", "--model", "preresnet20", *TINY, "trainer.batch_size=0",
                                 f"paths.output_dir={out}"], prog="swalab.results.row")
    assert "trainer.batch_size=0 must be >= 1" in err
    assert not out.exists()


def test_a_row_refuses_a_misspelt_key_as_run_py_does_naming_the_key_meant(tmp_path, capsys):
    from swalab.results.row import main

    out = tmp_path / "out"
    err = refused(capsys, main, ["--dataset", "digits", "--model", "preresnet20", "--dry-run", *TINY,
                                 "model.swa.strat=0.5", f"paths.output_dir={out}"], prog="swalab.results.row")
    assert err == ("[swalab.results.row] model.swa.strat=0.5: model.swa has no key 'strat', did you mean "
                   "model.swa.start? (`python run.py --cfg job` prints every key)")
    assert not out.exists()


# -- compare reads a run's weights as model.init_from reads them ------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny finished SGD run (PreResNet-8, two epochs on 128 digits)."""
    from hydra import compose, initialize_config_dir

    from swalab.train import train

    run_dir = tmp_path_factory.mktemp("runs") / "sgd"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, "model.arch.depth=8", "trainer.epochs=2", "method=sgd",
                                                       "run.eval_every=0"])
    train(cfg, run_dir=run_dir)
    return run_dir


def with_final(run: Path, where: Path, final: bytes) -> Path:
    shutil.copytree(run, where)
    (where / "final.pt").write_bytes(final)
    return where


def another_models_final() -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"model": torch.nn.Linear(3, 2).state_dict(), "methods": {}, "epoch": 2}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("damage", ["another model's", "cut short"])
def test_compare_on_a_run_whose_final_weights_cannot_serve_is_one_line_as_init_from_says_it(
        finished_run, tmp_path, capsys, damage):
    from swalab.results.compare import main

    final = another_models_final() if damage == "another model's" else (finished_run / "final.pt").read_bytes()[:2000]
    run = with_final(finished_run, tmp_path / "run", final)
    out = tmp_path / "compare.json"
    err = refused(capsys, main, [str(run), "--device", "cpu", "--out", str(out)], prog="swalab.results.compare")
    assert str(run / "final.pt") in err
    assert ("do not fit PreResNet" if damage == "another model's" else "cannot read it") in err
    assert not out.exists()


# -- a full disk --------------------------------------------------------------------------------------------
def test_a_report_on_a_full_disk_is_one_line_and_the_earlier_report_survives_whole(
        finished_run, tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    from swalab.results.report import main

    runs = tmp_path / "runs"
    shutil.copytree(finished_run, runs / "sgd")
    out = tmp_path / "report"
    assert main([str(runs), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "reliability.pdf" in before
    capsys.readouterr()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    err = refused(capsys, main, [str(runs), "--out", str(out)], prog="swalab.results.report")
    assert "No space left on device" in err and str(out) in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work folder left behind


# -- a path the file system cannot hold --------------------------------------------------------------------
def compose_run(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, "model.arch.depth=8", "trainer.epochs=1",
                                                        "method=sgd", *overrides])


@pytest.mark.parametrize("too_long", ["a folder name", "the whole path"])
def test_a_run_directory_the_file_system_cannot_hold_is_refused_before_anything_is_created(tmp_path, too_long):
    from swalab.config import ConfigError
    from swalab.train import train

    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    if too_long == "a folder name":
        run_dir = tmp_path / "outputs" / ("n" * (limit + 1)) / "seed0"
    else:  # every name fits, and so does the .lock; the files a run writes below it do not
        length = os.pathconf(tmp_path, "PC_PATH_MAX") - 20
        run_dir = tmp_path / "outputs"
        while len(str(run_dir)) < length:
            run_dir = run_dir / ("d" * min(200, length - len(str(run_dir)) - 1))
    with pytest.raises(ConfigError, match=r"run\.dir") as refusal:
        train(compose_run(f"run.dir={run_dir}"))
    assert "\n" not in str(refusal.value) and "shorter" in str(refusal.value)
    assert list(tmp_path.iterdir()) == []


def test_an_output_directory_the_file_system_cannot_hold_names_paths_output_dir(tmp_path):
    from swalab.config import ConfigError
    from swalab.train import train

    output_dir = tmp_path / ("o" * (os.pathconf(tmp_path, "PC_NAME_MAX") + 1))
    with pytest.raises(ConfigError, match=r"paths\.output_dir"):
        train(compose_run(f"paths.output_dir={output_dir}"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tool", ["report", "compare"])
def test_an_out_path_the_file_system_cannot_hold_is_one_line_before_any_work(finished_run, tmp_path, capsys, tool):
    from swalab.results import compare, report

    out = tmp_path / ("r" * (os.pathconf(tmp_path, "PC_NAME_MAX") - 5))  # fits, but not the temporary name beside it
    main = {"report": report.main, "compare": compare.main}[tool]
    err = refused(capsys, main, [str(finished_run), "--out", str(out)], prog=tool)
    assert "--out" in err and "shorter" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- a setting out of what its owner takes ------------------------------------------------------------------
def test_adamw_betas_of_one_number_are_refused_naming_the_key_and_its_length():
    from swalab.config import ConfigError
    from swalab.train import validate

    with pytest.raises(ConfigError, match=r"optimizer\.betas=\[0\.9\] must be a list of 2 numbers"):
        validate(compose_run("optimizer=adamw", "optimizer.betas=[0.9]"))


@pytest.mark.parametrize("override, key", [("trainer.batch_size=99999999999999999999", "trainer.batch_size"),
                                           (f"seed={2 ** 70}", "seed"),
                                           ("trainer.epochs=99999999999999999999", "trainer.epochs")])
def test_an_integer_too_large_for_64_bits_is_refused_naming_its_key(override, key):
    from swalab.config import ConfigError
    from swalab.train import validate

    with pytest.raises(ConfigError, match=rf"{re.escape(key)}=\d+ must be an integer below 2\*\*63"):
        validate(compose_run(override))


@pytest.mark.parametrize("command", ["rays", "curves"])
def test_the_analysis_commands_check_their_out_path_before_any_work_as_the_other_tools_do(
        finished_run, tmp_path, capsys, command):
    import importlib

    blocking = tmp_path / "a file"
    blocking.write_text("in the way")
    main = importlib.import_module(f"swalab.analysis.{command}").main
    args = ([str(finished_run)] if command == "curves" else ["--run", str(finished_run)])
    err = refused(capsys, main, [*args, "--out", str(blocking / "out")], prog="swalab.analysis")
    assert "--out" in err and "which is a file" in err


def test_method_laplace_without_laplace_torch_is_refused_in_one_line_before_anything_is_written(monkeypatch):
    """laplace-torch is an extra: without it, method=laplace (and a re-fit by results.score) says which package to
    install, as a refusal of the config, not an ImportError's traceback once the data were loaded."""
    import sys

    from swalab.config import ConfigError
    from swalab.methods.laplace import fit_laplace
    from swalab.train import validate

    monkeypatch.setitem(sys.modules, "laplace", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"^method=laplace needs PyPI's laplace-torch, which is not installed: "
                                          r"pip install 'swalab\[laplace\]'$"):
        validate(compose_run("method=laplace", "model.init_from=some-run", "dataset.val_size=20"))
    with pytest.raises(ConfigError, match=r"pip install 'swalab\[laplace\]'"):
        fit_laplace(None, [], [])


@pytest.mark.parametrize("tool", ["swalab.upgrade", "swalab.results.report", "swalab.results.compare",
                                  "swalab.results.score", "swalab.results.row", "swalab.results.wandb_report",
                                  "swalab.posthoc", "swalab.analysis"])
def test_every_tool_says_in_one_line_what_a_ctrl_c_leaves(tool, monkeypatch):
    """Each ``python -m <tool>`` hands ``swalab.cli.run_command`` what a Ctrl-C or SIGTERM leaves behind, so it ends
    in that one line (exit 130 / 143), not a KeyboardInterrupt traceback."""
    import swalab.cli

    told = {}
    monkeypatch.setattr(swalab.cli, "run_command", lambda main, *args, **kwargs: told.update(kwargs) or 0)
    monkeypatch.setattr(sys, "argv", [tool, "curves"] if tool == "swalab.analysis" else [tool])
    try:
        runpy.run_module(tool, run_name="__main__")
    except SystemExit:  # sys.exit(run_command(...))
        pass
    assert isinstance(told.get("interrupted"), str) and told["interrupted"], told



HELPED_TOOLS = ["swalab.results.report", "swalab.results.compare", "swalab.results.score", "swalab.results.row",
                "swalab.analysis.plane", "swalab.analysis.rays", "swalab.analysis.segment", "swalab.analysis.curves"]


@pytest.mark.parametrize("tool", HELPED_TOOLS)
def test_a_tools_help_shows_its_description_without_rest_markup(tool, capsys):
    import importlib

    with pytest.raises(SystemExit) as exit_:
        module = importlib.import_module(tool)
        (module.parse_args if hasattr(module, "parse_args") else module.main)(["--help"])
    shown = capsys.readouterr().out
    first_words = " ".join(module.__doc__.split()[:4]).replace("``", "`")
    assert exit_.value.code == 0 and first_words in " ".join(shown.split()) and "``" not in shown
