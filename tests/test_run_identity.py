"""One config, one run: run identity, directory names, the per-run lock, refusals that leave nothing behind,
and grids that say how each job ended (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import CONF_DIR, REPO
from swalab.config import ConfigError, default_choices
from swalab.grid import read_jobs
from swalab.identity import differences, group_hash, identity_of, label_of, record, run_name, stored_identity
from swalab.runlock import RunLock, RunLocked
from swalab.train import prepare, train
from swalab.train.records import one_line

QUIET = ["logger=none", "run.progress=false"]
TINY = [*QUIET, "dataset.train_size=128", "trainer.batch_size=64", "trainer.epochs=2", "model.arch.depth=8",
        "run.eval_every=0"]
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+\-/]+$")


def compose_hydra(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def plan_of(output_dir: Path, *overrides: str):
    """What ``python run.py <overrides>`` would do, decided without writing anything (inside a Hydra application,
    as run.py decides it: the defaults a run is named against are composed there)."""
    overrides = [*overrides, f"paths.output_dir={output_dir}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        return prepare(task, overrides=overrides, choices=choices)


def cli(*args: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# -- names --------------------------------------------------------------------------------------------

def test_a_run_is_named_by_its_group_choices_and_overrides_that_can_change_results(tmp_path):
    default = plan_of(tmp_path, *QUIET).run_dir
    cosine = plan_of(tmp_path, *QUIET, "method=sgd", "schedule=cosine").run_dir
    short = plan_of(tmp_path, *QUIET, "trainer.epochs=6", "run.device=cpu", "run.progress=true").run_dir
    assert default.relative_to(tmp_path).as_posix() == "digits/preresnet20/swa/default/seed0"
    assert cosine.relative_to(tmp_path).as_posix() == "digits/preresnet20/sgd/schedule-cosine/seed0"
    assert short.relative_to(tmp_path).as_posix() == "digits/preresnet20/swa/trainer.epochs-6/seed0"  # device: not a result


def test_a_schedule_switched_on_the_command_line_is_another_run_not_a_skip(tmp_path):
    """The issue's first case: `python run.py` then `python run.py schedule=cosine` must not share a run."""
    first = plan_of(tmp_path, *QUIET, "method=sgd")
    second = plan_of(tmp_path, *QUIET, "method=sgd", "schedule=cosine")
    assert first.run_dir != second.run_dir and first.identity != second.identity
    assert second.finished is None


def test_names_use_only_characters_a_shell_and_an_override_take_unquoted():
    choices = {"dataset": "digits", "model": "preresnet20", "method": "swa", "schedule": "paper_sgd"}
    names = {"dataset": "digits", "model": "preresnet20", "method": "swa"}
    odd = run_name(names, 0, {"model.swa.score_at_budgets": [1.0, 1.25], "model.init_from": "/a b/c@3",
                              "model.arch.widths": {"a": 1}}, choices, "0123456789ab")
    assert SAFE_NAME.match(odd) and "=" not in odd and "," not in odd
    assert odd.endswith("+id-01234567/seed0")  # a name that had to drop characters carries the group hash
    clean = run_name(names, 1, {"model.swa.score_at_budgets": [1.0, 1.25]}, choices, "0123456789ab")
    assert clean == "digits/preresnet20/swa/swa.score_at_budgets-1_1.25/seed1"
    unknown = run_name(names, 1, None, choices, "0123456789ab")  # composed in Python: its defaults unknown
    assert unknown == "digits/preresnet20/swa/default+id-01234567/seed1"


def test_a_run_directory_passes_unquoted_as_run_init_from(tmp_path):
    run_dir = plan_of(tmp_path, *QUIET, "method=sgd", "model.swa.score_at_budgets=[1.0,1.25]",
                      "trainer.epochs=3").run_dir
    cfg = compose_hydra(*QUIET, f"model.init_from={run_dir}@2")  # Hydra parses it as written
    assert cfg.model.init_from == f"{run_dir}@2"


def test_the_identity_leaves_out_only_what_cannot_change_results():
    def identity(*overrides):
        return identity_of(OmegaConf.to_container(compose_hydra(*QUIET, *overrides), resolve=True))

    base = identity()
    for harmless in ("run.device=cpu", "run.eval_batch_size=10", "run.keep_checkpoints=5",
                     "paths.output_dir=/elsewhere", "logger=wandb", "run.progress=true", "run.deterministic=false",
                     "run.cuda_graphs=off"):
        assert identity(harmless) == base, harmless
    for result in ("trainer.epochs=3", "schedule=cosine", "model.swa.lr=0.05", "dataset.train_size=100", "seed=1",
                   "trainer.batch_size=64", "model.arch.depth=8"):
        assert identity(result) != base, result
    seeds = [identity(f"seed={s}") for s in (0, 1)]
    assert group_hash(seeds[0]) == group_hash(seeds[1])  # the seeds of one config share a group


def test_the_default_choices_are_read_from_the_primary_config():
    assert {k: default_choices()[k] for k in ("dataset", "model", "method", "schedule", "run")} == {
        "dataset": "digits", "model": "preresnet20", "method": "swa", "schedule": "paper_sgd", "run": "default"}


# -- refusals before anything is written ------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("trainer.epochs=2.5", "trainer.epochs=2.5 must be an integer"),
    ("seed=abc", "seed='abc' must be an integer"),
    ("+model.lr_scale=2", "swalab reads no key 'model.lr_scale'"),
    ("+optimizer.lr=nan", "optimizer.lr=nan must be a finite number"),  # an argument of the optimizer: checked by it
    ("+trainer.foo=1", "swalab reads no key 'trainer.foo'"),
])
def test_bad_keys_and_values_are_refused_naming_them(tmp_path, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_of(tmp_path, *QUIET, override)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, message", [
    (["model.lr=nan"], "model.lr=nan must be a finite number"),
    (["model.swa.lr=nan"], "model.swa.lr=nan must be a finite number"),
    (["optimizer.momentum=nan"], "optimizer.momentum=nan must be a finite number"),
    (["model.weight_decay=nan"], "model.weight_decay=nan must be a finite number"),
    (["dataset.std=[nan]"], "dataset.std=[nan] must be a list of finite numbers"),
    (["dataset.mean=[inf]"], "dataset.mean=[inf] must be a list of finite numbers"),
    (["method=ema", "method.warmup_gamma=nan"], "method.warmup_gamma=nan must be a finite number"),
    (["method=ema", "method.decay=nan"], "method.decay=nan must be a finite number"),
    (["method.budget=inf"], "method.budget=inf must be a finite number"),
    (["method=fge", "model.fge.lr_min=0.1", "model.fge.lr_max=0.01"], "model.fge.lr_min=0.1 is above model.fge.lr_max"),
])
def test_nan_inf_and_upside_down_settings_are_refused_before_anything_is_written(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_of(tmp_path, *QUIET, *overrides)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, message", [
    (["model.lr=-1"], "model.lr=-1 must be > 0"),
    (["model.weight_decay=-1"], "model.weight_decay=-1 must be >= 0"),
    (["model.lr=abc"], "model.lr='abc' must be a finite number"),
    (["schedule.lr=nan"], "schedule.lr=nan must be a finite number"),  # typed there: named there
])
def test_a_refusal_names_the_key_the_user_typed_not_the_key_that_reads_it(tmp_path, overrides, message):
    """schedule.lr is ${model.lr} and trainer.weight_decay ${model.weight_decay}: a bad model.lr is refused as
    model.lr, the key on the command line (design: one name per setting, in every message)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_of(tmp_path, *QUIET, *overrides)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_an_ema_that_would_never_update_is_refused_once_the_steps_are_known(tmp_path, make_cfg):
    with pytest.raises(ConfigError, match=r"method.update_every=100000 but the run has only 4 optimizer steps"):
        train(make_cfg(*TINY, "method=ema", "method.update_every=100000"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_setting_the_chosen_method_does_not_have_is_refused_even_with_plus(tmp_path):
    with pytest.raises(ConfigError, match=r"method\.start is not a setting of method .*it takes: .*budget"):
        plan_of(tmp_path, *QUIET, "method=sgd", "+method.start=3")


def test_a_refused_config_never_touches_an_interrupted_run_in_its_directory(tmp_path, make_cfg):
    run_dir = tmp_path / "run"
    train(make_cfg(*TINY), run_dir=run_dir)
    (run_dir / "metrics.json").unlink()  # now it looks interrupted
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="run.device='tpu'"):
        train(make_cfg(*TINY, "run.device=tpu"), run_dir=run_dir)
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_the_cli_refuses_in_one_line_with_exit_2_and_creates_nothing(tmp_path):
    done = cli(*QUIET, "trainer.epochs=2.5", f"paths.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["[swalab] trainer.epochs=2.5 must be an integer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/, no .hydra/, no run.log


def test_a_grid_asked_for_its_config_is_refused_in_one_line_saying_to_drop_m(tmp_path):
    """--cfg is a mode of Hydra's, like -m: the two together were refused with a traceback (docs/cluster.md)."""
    done = cli("-m", "--cfg", "job", "method=sgd,swa", cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("[swalab] Only one of --run, --multirun, --cfg") and "drop -m" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("old, new, value", [("trainer.deterministic", "run.deterministic", "false"),
                                             ("method.avg_device", "run.avg_device", "cpu")])
def test_a_key_of_an_earlier_version_is_refused_naming_the_key_it_became(tmp_path, old, new, value):
    from dataclasses import fields

    from swalab.settings import RunSettings

    assert new.split(".")[1] in [f.name for f in fields(RunSettings)]  # where it lives today
    done = cli(*QUIET, f"{old}={value}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"[swalab] {old} is now {new}: write {new}={value}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # refused before anything is written


def test_an_unwritable_output_directory_is_one_line(tmp_path):
    blocker = tmp_path / "outputs"
    blocker.write_text("a file where the output directory should be")
    done = cli(*QUIET, f"paths.output_dir={blocker}", cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"[swalab] cannot write the run directory {blocker}/digits") and "paths.output_dir=" in line


# -- one process per run -------------------------------------------------------------------------------

HOLD = textwrap.dedent("""
    import sys, time
    from swalab.runlock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(60)
""")


def hold_lock(run_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_process_on_the_same_run_exits_at_once_naming_the_holder(tmp_path, make_cfg):
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    try:
        start = time.monotonic()
        with pytest.raises(RunLocked, match=rf"being trained by another process \(PID {holder.pid} on host "):
            train(make_cfg(*TINY), run_dir=run_dir)
        assert time.monotonic() - start < 10  # at once: no data loaded, nothing trained
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing of ours written
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = RunLock(run_dir).acquire()
    try:
        assert f"PID {holder.pid}" in lock.took_over()
        assert json.loads((run_dir / ".lock").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_the_same_command_started_twice_trains_once(tmp_path):
    """The first process stops itself mid-training (SIGSTOP, swalab.faults) while holding the lock."""
    args = [*TINY, f"paths.output_dir={tmp_path / 'out'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SWALAB_FAULT": "train_step:2:STOP"}
    first = subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not open(f"/proc/{first.pid}/stat").read().split()[2] == "T":
            time.sleep(0.1)
        second = cli(*args, cwd=tmp_path)
    finally:
        first.send_signal(signal.SIGCONT)
    first.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 2
    assert f"being trained by another process (PID {first.pid} on host " in second.stderr
    assert len(list((tmp_path / "out").rglob("metrics.json"))) == 1



def test_an_override_a_method_never_reads_names_the_same_run(tmp_path):
    """A second grid with an SWA-only override (``model.swa.lr``) gives its SGD job the name of the SGD run of the
    first grid (one config, one name): it is skipped, not trained again; the SWA job is a new run."""
    out = tmp_path / "out"
    first = cli(*TINY, "method=sgd", f"paths.output_dir={out}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = cli(*TINY, "method=sgd", "model.swa.lr=0.05", f"paths.output_dir={out}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "skipping" in again.stdout.lower()
    assert len(list((out / "digits/preresnet20/sgd").rglob("metrics.json"))) == 1
    assert plan_of(out, *TINY, "method=sgd", "model.swa.lr=0.05").run_dir == plan_of(out, *TINY, "method=sgd").run_dir
    swa = plan_of(out, *TINY, "method=swa", "model.swa.lr=0.05")
    assert "+swa.lr-0.05+" in swa.run_dir.as_posix() and swa.finished is None


def test_a_run_named_by_an_earlier_swalab_is_refused_with_the_command_that_moves_it(tmp_path):
    out = tmp_path / "out"
    assert cli(*TINY, "method=sgd", f"paths.output_dir={out}", cwd=tmp_path).returncode == 0
    [today] = [p.parent for p in out.rglob("metrics.json")]
    record = json.loads((today / "identity.json").read_text())
    old_name = today.parent.parent / f"{today.parent.name}+run.eval_every-0" / "seed0"  # named from the command line
    old_name.parent.mkdir()
    today.rename(old_name)
    record.pop("version")
    (old_name / "identity.json").write_text(json.dumps(record))
    again = cli(*TINY, "method=sgd", f"paths.output_dir={out}", cwd=tmp_path)
    assert again.returncode == 2 and f"mv {old_name} {today}" in again.stderr
    old_name.rename(today)
    assert "skipping" in cli(*TINY, "method=sgd", f"paths.output_dir={out}", cwd=tmp_path).stdout


# -- grids -----------------------------------------------------------------------------------------------

def test_a_refusal_that_lists_problems_keeps_them_on_its_one_line():
    """What a grid's summary and status.json record: the keys to fix, not just "invalid config"."""
    exc = ConfigError("invalid config:\n  - seed='abc' must be an integer\n  - trainer.epochs=2.5 must be an integer")
    assert one_line(exc) == ("ConfigError: invalid config: seed='abc' must be an integer; "
                             "trainer.epochs=2.5 must be an integer")
    assert one_line(FileNotFoundError("no data under dataset.root\nExpected one of these layouts:")) == \
        "FileNotFoundError: no data under dataset.root"


def test_a_grid_with_a_failed_job_prints_a_summary_and_exits_non_zero(tmp_path):
    done = cli("-m", *TINY, "method=sgd", "model.init_from=null,/nonexistent/weights.pt",
               f"paths.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    summary = done.stdout[done.stdout.index("[swalab] grid summary"):].splitlines()
    assert summary[0] == "[swalab] grid summary: 1 of 2 jobs finished; 1 did not: refused"
    assert summary[1].split()[:2] == ["#0", "complete"]
    assert summary[2].split()[:2] == ["#1", "refused"] and "no such file or run directory" in summary[2]
    [grid] = (tmp_path / "out" / "grids").iterdir()
    assert (grid / "summary.txt").read_text().splitlines() == summary
    assert sorted(p.name for p in (grid / "jobs").iterdir()) == ["0000.json", "0001.json"]


def test_two_grids_started_together_keep_records_of_their_own(tmp_path):
    """Grids launched by a script or a job array start within one second: each keeps its own record."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    grids = [subprocess.Popen([sys.executable, str(REPO / "run.py"), "-m", *TINY, "method=sgd", f"seed={seed}",
                               f"paths.output_dir={tmp_path / 'out'}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (0, 1)]
    for grid in grids:
        grid.communicate(timeout=300)
        assert grid.returncode == 0
    records = sorted((tmp_path / "out" / "grids").iterdir())
    assert len(records) == 2
    assert sorted(job["run_dir"][-5:] for r in records for job in read_jobs(r)) == ["seed0", "seed1"]


def test_hydra_run_dir_is_refused_naming_run_dir(tmp_path):
    done = cli(*QUIET, f"hydra.run.dir={tmp_path / 'mine'}", f"paths.output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2 and "Use run.dir=<dir> to place this run" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing trained (Hydra itself made the empty folder it was given)


def test_an_unfinished_run_is_never_started_from_or_scored_as_if_finished(tmp_path, make_cfg):
    from swalab.results.compare import score_run
    from swalab.runweights import load_weights

    parent = tmp_path / "parent"
    train(make_cfg(*TINY, "method=sgd", "run.save_at=[1]", "run.keep_finished_checkpoints=true"), run_dir=parent)
    (parent / "metrics.json").unlink()  # as if it were still training (or had stopped) after its last epoch
    with pytest.raises(FileNotFoundError, match=r"model.init_from=.*parent has not finished \(its newest kept "
                                                r"checkpoint is epoch 2 of 2[;)].*: name an epoch explicitly"):
        train(make_cfg(*TINY, "method=sgd", f"model.init_from={parent}"), run_dir=tmp_path / "child")
    with pytest.raises(FileNotFoundError, match="has not finished"):
        score_run(parent, device="cpu")
    with pytest.raises(FileNotFoundError, match="has not finished"):
        load_weights(str(parent))
    assert load_weights(f"{parent}@1")  # an explicit epoch is always there to start from
    train(make_cfg(*TINY, "method=sgd", f"model.init_from={parent}@1"), run_dir=tmp_path / "child")
    assert json.loads((tmp_path / "child" / "lineage.json").read_text())["epoch"] == 1


def test_a_grid_record_finds_its_runs_from_any_directory_and_after_a_move(tmp_path):
    from swalab.results.report import report

    work = tmp_path / "work"
    work.mkdir()
    done = cli("-m", *TINY, "method=sgd", "seed=0,1", "paths.output_dir=out", cwd=work)  # relative, as by default
    assert done.returncode == 0, done.stderr[-2000:]
    (tmp_path / "moved").mkdir()
    (work / "out").rename(tmp_path / "moved" / "out")
    [grid] = (tmp_path / "moved" / "out" / "grids").iterdir()
    found = report([grid], tmp_path / "report")  # read from the repository's directory, not the grid's
    assert len(found["finished"]) == 2
    assert all(Path(job["run_dir"]).is_dir() for job in read_jobs(grid))


def test_an_empty_output_directory_is_refused_before_a_grid_writes_its_record(tmp_path):
    done = cli("-m", *TINY, "method=sgd", "paths.output_dir=", cwd=tmp_path)
    assert done.returncode == 2 and "paths.output_dir is empty" in done.stderr
    assert not Path("/grids").exists() and list(tmp_path.iterdir()) == []


def test_a_run_records_what_sets_it_apart_from_its_defaults_in_the_keys_typed(tmp_path):
    done = cli(*TINY, "method=swa", "model.swa.lr=0.05", "model.swa.start_epoch=1", "schedule=cosine",
               "model.swa.pre_schedule=base", f"paths.output_dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = [json.loads(p.read_text()) for p in tmp_path.rglob("identity.json")]
    apart = record["apart"]
    assert list(apart)[0] == "schedule" and apart["schedule"] == "cosine"  # a group choice, first
    assert apart["model.swa.lr"] == 0.05  # the key typed, which is the name SWA takes it by
    assert apart["model.swa.start_epoch"] == 1 and apart["model.swa.pre_schedule"] == "base"
    assert apart["trainer.epochs"] == 2 and apart["dataset.train_size"] == 128
    assert "seed" not in apart and not any(k.startswith("data.") for k in apart)


def test_a_setting_typed_as_the_methods_key_or_its_recipe_blocks_key_is_one_run_under_one_name(tmp_path):
    """``method.lr`` (SWA's argument) reads ``model.swa.lr`` (the model's recipe): typed either way, one identity and
    one directory, named by the recipe's key; so are ``schedule.lr`` and ``model.lr``, which the schedule reads."""
    by_method = plan_of(tmp_path, *QUIET, "method=swa", "method.lr=0.05")
    by_recipe = plan_of(tmp_path, *QUIET, "method=swa", "model.swa.lr=0.05")
    assert by_method.identity == by_recipe.identity and by_method.identity["method.lr"] == 0.05
    assert by_method.run_dir == by_recipe.run_dir and by_method.run_dir.parent.name == "swa.lr-0.05"
    by_schedule, by_model = plan_of(tmp_path, *QUIET, "schedule.lr=0.07"), plan_of(tmp_path, *QUIET, "model.lr=0.07")
    assert by_schedule.identity == by_model.identity and by_schedule.run_dir == by_model.run_dir
    both = plan_of(tmp_path, *QUIET, "method=swa", "method.lr=0.03", "model.arch.depth=8", "schedule.lr=0.07")
    assert both.run_dir.parent.name == "arch.depth-8+model.lr-0.07+swa.lr-0.03"  # sorted by the key shown


def test_a_value_typed_for_a_key_whose_every_reader_is_typed_too_is_refused_naming_both(tmp_path):
    """``model.swa.lr`` is read only by ``method.lr``: typed both, at other values, SWA trains at ``method.lr``'s
    whatever the order, so the command is refused before anything is written; the same value twice is one setting,
    and a key no setting of the method reads (``model.swa.lr`` for SGD) is left to the method's own check."""
    for overrides in (["model.swa.lr=0.05", "method.lr=0.06"], ["method.lr=0.06", "model.swa.lr=0.05"]):
        with pytest.raises(ConfigError, match=r"^model\.swa\.lr=0\.05 is read only by method\.lr, which this command "
                                              r"sets itself \(method\.lr=0\.06\), so model\.swa\.lr=0\.05 would "
                                              r"change nothing: give one of the two"):
            plan_of(tmp_path, *QUIET, "method=swa", *overrides)
    with pytest.raises(ConfigError, match=r"^model\.lr=0\.05 is read only by schedule\.lr, which this command"):
        plan_of(tmp_path, *QUIET, "schedule=cosine", "model.lr=0.05", "schedule.lr=0.1")
    assert list(tmp_path.iterdir()) == []
    agreed = plan_of(tmp_path, *QUIET, "method=swa", "model.swa.lr=0.05", "method.lr=5e-2")
    assert agreed.run_dir == plan_of(tmp_path, *QUIET, "method=swa", "model.swa.lr=0.05").run_dir
    assert plan_of(tmp_path, *QUIET, "method=sgd", "model.swa.lr=0.05", "schedule.lr=0.1").identity["schedule.lr"] == 0.1


def test_a_methods_own_key_on_the_command_line_is_taken_not_refused_as_an_earlier_versions(tmp_path):
    """``method.phase``, ``method.cycle_epochs`` were SWA's keys of identity version 1 (moved to ``model.swa`` then) and
    are its keys again: taken as typed, named by the recipe key they stand for, and a config of today comes back from
    the reader of earlier configs as it is (its own ``method.phase`` kept, not the recipe block's)."""
    from swalab.compat import moved_keys, upgraded_config

    args = ["method=swa", "method.phase=cyclic", "method.lr_min=0.001", "method.cycle_epochs=2"]
    assert moved_keys(args) == []
    plan = plan_of(tmp_path, *QUIET, *args)
    assert (plan.identity["method.phase"], plan.cfg.model.swa.phase) == ("cyclic", "constant")
    assert plan.run_dir.parent.name == "swa.cycle_epochs-2+swa.lr_min-0.001+swa.phase-cyclic"
    resolved = OmegaConf.to_container(plan.cfg, resolve=True)
    assert upgraded_config(resolved) == resolved
    assert moved_keys(["method.swa_lr=0.05"]) == ["method.swa_lr is now model.swa.lr: write model.swa.lr=0.05"]


def test_a_recipe_key_the_method_does_not_read_is_refused_naming_it_and_the_keys_it_has():
    """A key an experiment's yaml adds to ``model.swa`` (a misspelt ``strat``) is read by no setting of SWA's; the
    command line's ``+model.swa.strat=`` is refused before (``config.check_overrides``)."""
    from swalab.train.plan import validate

    cfg = compose_hydra(*QUIET, "method=swa")
    OmegaConf.set_struct(cfg, False)
    cfg.model.swa.strat = 0.5
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    assert str(refused.value).startswith("model.swa.strat is read by no setting of method=swa, so it would change "
                                         "nothing: model.swa has start, start_epoch, lr, ")
    cfg.method = compose_hydra(*QUIET, "method=sgd").method  # no method reads model.swa: nothing to refuse
    validate(cfg)


def test_a_model_without_the_recipe_block_its_method_reads_is_refused_naming_the_fix():
    """A model's yaml of one's own not started from the base recipe has no ``model.swa``: SWA, which reads it, says
    so before anything is written; SGD, which does not, runs."""
    from swalab.train.plan import validate

    cfg = compose_hydra(*QUIET, "method=swa")
    OmegaConf.set_struct(cfg, False)
    del cfg.model["swa"]
    with pytest.raises(ConfigError, match=r"^method=swa reads model\.swa\.start, which model=preresnet20 lacks: start "
                                          r"the model's yaml from the base recipe \(defaults: \[/recipe/paper@_here_\]"):
        validate(cfg)
    cfg.method = compose_hydra(*QUIET, "method=sgd").method
    validate(cfg)


def test_a_bad_value_of_a_methods_setting_is_refused_by_the_key_typed(tmp_path):
    """One check, in the method (``method.lr``); the refusal names the key the value came from."""
    with pytest.raises(ConfigError, match=r"^model\.swa\.lr=-1 must be > 0$"):
        plan_of(tmp_path, *QUIET, "method=swa", "model.swa.lr=-1")
    with pytest.raises(ConfigError, match=r"^method\.lr=-1 must be > 0$"):
        plan_of(tmp_path, *QUIET, "method=swa", "method.lr=-1")
    with pytest.raises(ConfigError, match=r"model\.fge\.lr_min=0\.1 is above model\.fge\.lr_max=0\.02"):
        plan_of(tmp_path, *QUIET, "method=fge", "model.fge.lr_min=0.1")


def test_a_key_given_twice_names_the_run_once_with_the_value_applied(tmp_path):
    twice = plan_of(tmp_path, *QUIET, "trainer.epochs=4", "trainer.epochs=6")
    once = plan_of(tmp_path, *QUIET, "trainer.epochs=6")
    assert twice.run_dir == once.run_dir and "trainer.epochs-6" in str(twice.run_dir)
    assert "trainer.epochs-4" not in str(twice.run_dir)


@pytest.mark.parametrize("override, key", [
    ("seed=1", "seed: 0 there, 1 here"),                                        # the seed
    ("schedule=cosine", "schedule._target_"),                                   # a group choice
    ("model.swa.lr=0.05", "model.swa.lr: 0.02 there, 0.05 here"),              # a key only the method reads
    ("model.swa.bn_update=false", "model.swa.bn_update: True there, False here"),     # a method key
    ("dataset.train_size=64", "dataset.train_size: 128 there, 64 here"),        # a data key
    ("trainer.batch_size=32", "trainer.batch_size: 64 there, 32 here"),         # a trainer key
])
def test_a_run_directory_refuses_every_kind_of_other_config_naming_the_key(tmp_path, make_cfg, override, key):
    base = [*TINY, "method=swa", "model.swa.start_epoch=1", "model.swa.pre_schedule=base"]  # follows the schedule group
    run_dir = tmp_path / "run"
    train(make_cfg(*base), run_dir=run_dir)
    with pytest.raises(ConfigError, match="holds a run of another config") as refused:
        prepare(make_cfg(*base, override), run_dir=run_dir)
    assert key in str(refused.value)
    assert prepare(make_cfg(*base), run_dir=run_dir).finished is not None  # its own config: skipped, not refused


def test_a_lock_taken_over_from_a_killed_run_is_written_to_its_run_log(tmp_path):
    args = [*TINY, "method=sgd", f"run.dir={tmp_path / 'run'}"]
    env_kill = {**os.environ, "OMP_NUM_THREADS": "1", "SWALAB_FAULT": "train_step:3:KILL"}
    killed = subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=env_kill,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    log = (tmp_path / "run" / "run.log").read_text()
    assert re.search(r"took over the lock of PID \d+ on host .*, which no longer holds it", log)


def test_a_grid_whose_record_cannot_be_written_stops_before_its_first_job(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the outputs should go")
    done = cli("-m", *TINY, "method=sgd,swa", f"paths.output_dir={blocked}/out", cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot write the grid's record" in done.stderr and "paths.output_dir=<dir>" in done.stderr
    assert "training" not in done.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["blocked"]


def test_every_key_of_conf_is_classified_by_where_it_is_declared():
    """Each top-level key of every composed config is a group of what a run computes (it counts) or of how and where
    it runs (it never counts); an experiment's own helper key must reach the run through an interpolation."""
    from swalab.identity import METHOD_RECIPES, READ_THROUGH, RESULT_GROUPS, RUN_GROUPS

    experiments = [p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")]
    for experiment in [None, *experiments]:
        cfg = compose_hydra(*QUIET, *([f"experiment={experiment}"] if experiment else []))
        raw = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k in RESULT_GROUPS]))
        for key in cfg:
            if key in RESULT_GROUPS or key in RUN_GROUPS:
                continue
            assert f"${{{key}." in raw, f"{experiment}: top-level key {key!r} is classified nowhere"
    settings = REPO / "src" / "swalab" / "settings.py"  # the trainer and run groups are defined there
    text = "".join(p.read_text() for p in [*CONF_DIR.rglob("*.yaml"), settings])
    for key in READ_THROUGH:  # each is read through an interpolation where identity.py says
        if key == "dataset.source":
            for option in ("cifar10", "digits", "folder", "imagenet"):
                dataset = compose_hydra(*QUIET, f"dataset={option}", *(["dataset.root=x"] if option == "folder" else [])
                                        ).dataset
                for k in dataset.source:  # each an interpolation, or the data set's key of that name as it is
                    raw = str(dataset.source._get_node(k)._value())
                    assert k == "_target_" or raw.startswith("${") or raw == str(dataset.get(k)), (option, k, raw)
        elif key in METHOD_RECIPES:  # every key of the block is read by the method key of its name
            block = OmegaConf.load(CONF_DIR / "recipe" / "paper.yaml")[key.split(".")[1]]
            for k in block:
                assert f"{k}: ${{{key}.{k}}}" in text, f"{key}.{k} is read by no method key"
        else:
            assert f"${{{key}}}" in text or f"${{{key}," in text or f",${{{key}}}" in text, key


# -- a weights file is what it holds; names an earlier swalab gave; a method that trains nothing ----------------------

def weights_file(path: Path, value: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.full((4,), value)}, path)
    return path


def test_a_weights_file_is_the_same_run_wherever_it_lies_and_another_run_once_its_content_changes(tmp_path):
    out, first = tmp_path / "out", weights_file(tmp_path / "a" / "w.pt", 1.0)
    here = plan_of(out, *QUIET, "method=sgd", f"model.init_from={first}")
    (tmp_path / "b").mkdir()
    moved = first.rename(tmp_path / "b" / "renamed.pt")
    there = plan_of(out, *QUIET, "method=sgd", f"model.init_from={moved}")
    assert there.identity == here.identity and there.run_dir == here.run_dir  # moved: the same config, one directory
    assert here.identity["model.init_from"].startswith("sha256-") and str(first) not in str(here.run_dir)
    assert "model.init_from-sha256-" in here.run_dir.parent.name
    weights_file(moved, 2.0)  # rewritten in place: other weights, another run
    rewritten = plan_of(out, *QUIET, "method=sgd", f"model.init_from={moved}")
    assert rewritten.identity != here.identity and rewritten.run_dir != here.run_dir


def test_a_pretrained_file_counts_by_its_content_as_the_network_reads_it():
    resolved = {"model": {"pretrained_file": None, "arch": {"pretrained_file": None}}}

    def identity(path):
        resolved["model"]["pretrained_file"] = resolved["model"]["arch"]["pretrained_file"] = str(path)
        return identity_of(resolved)

    with tempfile.TemporaryDirectory() as tmp:
        a = weights_file(Path(tmp) / "a.pt", 1.0)
        (Path(tmp) / "elsewhere").mkdir()
        b = Path(shutil.copy(a, Path(tmp) / "elsewhere" / "b.pt"))  # a copy: the same content
        c = weights_file(Path(tmp) / "c.pt", 3.0)
        assert identity(a) == identity(b) != identity(c)
        assert set(identity(a)) == {"model.arch.pretrained_file"}  # model.pretrained_file is read through it


def earlier_record(plan, version: int = 2) -> dict:
    """The identity.json an earlier swalab (identity ``version`` 2 or 3) wrote for the run ``plan`` plans: a weights
    file or a source run by its path, named and hashed so."""
    identity = {**plan.identity, **{k: plan.cfg.model.init_from for k in ("model.init_from",) if k in plan.identity}}
    apart = {k: identity[k] if k == "model.init_from" else v for k, v in plan.settings.items()}
    return {"version": version, "hash": "x", "group": group_hash(identity), "identity": identity, "apart": apart}


def earlier_dir(out: Path, plan, then: dict) -> Path:
    """Where identity ``then["version"]`` named the run ``plan`` plans (``swalab.upgrade.name_tail``)."""
    from swalab.upgrade import name_tail

    rest, seed = name_tail(then["apart"], plan.cfg.seed, then["group"], then["version"])
    return plan.run_dir.parent.parent / rest / seed


def upgraded(out: Path) -> str:
    """``python -m swalab.upgrade <out> --write``, in process; what it printed."""
    import contextlib
    import io

    from swalab.upgrade import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(out), "--write"]) == 0
    return printed.getvalue()


def test_a_run_named_by_identity_version_2_is_refused_until_the_upgrade_renames_it_then_continued_or_skipped(tmp_path):
    """Whole keys (``model.swa.score_every-1``) and a weights file by its path were the names of identity version 2:
    the same command refuses to train the config again beside such a run, naming the upgrade; once renamed, the run
    is continued there if unfinished and skipped if finished."""
    out = tmp_path / "out"
    swa = plan_of(out, *QUIET, "model.swa.score_every=1")
    assert swa.run_dir.relative_to(out).as_posix() == "digits/preresnet20/swa/swa.score_every-1/seed0"
    then = earlier_record(swa)
    old = earlier_dir(out, swa, then)
    assert old.relative_to(out).as_posix() == "digits/preresnet20/swa/model.swa.score_every-1/seed0"
    old.mkdir(parents=True)
    (old / "identity.json").write_text(json.dumps(then))
    with pytest.raises(ConfigError, match=rf"the run of this config is in {old}, named by an earlier swalab.*"
                                          rf"python -m swalab.upgrade {old} --write"):
        plan_of(out, *QUIET, "model.swa.score_every=1")
    assert "directory renamed to today's name swa.score_every-1/seed0" in upgraded(out)
    again = plan_of(out, *QUIET, "model.swa.score_every=1")
    assert again.run_dir == swa.run_dir and again.finished is None  # an interrupted run: continued in its directory

    short = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))  # a version-2 name spells a path whole only when it fits
    weights = weights_file(short / "w.pt", 1.0)
    sgd = plan_of(out, *QUIET, "method=sgd", f"model.init_from={weights}")
    then = earlier_record(sgd)
    assert then["identity"]["model.init_from"] == str(weights)
    old_dir = earlier_dir(out, sgd, then)
    assert "model.init_from-" in old_dir.as_posix() and "sha256" not in old_dir.as_posix()
    old_dir.mkdir(parents=True)
    (old_dir / "identity.json").write_text(json.dumps(then))
    (old_dir / "metrics.json").write_text(json.dumps({"sgd": {"acc": 50.0}}))
    upgraded(out)
    found = plan_of(out, *QUIET, "method=sgd", f"model.init_from={weights}")
    assert found.run_dir == sgd.run_dir and found.finished == {"sgd": {"acc": 50.0}}  # skipped, not trained again
    shutil.rmtree(short, ignore_errors=True)


def test_a_new_seed_of_a_config_named_by_identity_version_2_is_refused_until_the_upgrade_renames_its_seeds(tmp_path):
    """One config keeps one directory of seeds: a seed added beside seeds an earlier swalab named is refused, naming
    the upgrade, which renames them; then it goes beside them. Another config is not held up."""
    out = tmp_path / "out"
    seed0 = plan_of(out, *QUIET, "model.swa.score_every=1")
    old = earlier_dir(out, seed0, earlier_record(seed0))
    old.mkdir(parents=True)
    (old / "identity.json").write_text(json.dumps(earlier_record(seed0)))
    (old / "metrics.json").write_text(json.dumps({"swa": {"acc": 50.0}}))
    with pytest.raises(ConfigError, match=rf"other seeds of this config are in {old.parent}.*python -m swalab.upgrade"):
        plan_of(out, *QUIET, "model.swa.score_every=1", "seed=1")
    other = plan_of(out, *QUIET, "model.swa.score_every=2", "seed=1")
    assert other.run_dir.relative_to(out).as_posix() == "digits/preresnet20/swa/swa.score_every-2/seed1"
    upgraded(out)
    assert plan_of(out, *QUIET, "model.swa.score_every=1", "seed=1").run_dir == seed0.run_dir.parent / "seed1"


def test_a_method_that_trains_nothing_is_not_named_or_set_apart_by_what_only_training_reads(tmp_path):
    weights = weights_file(tmp_path / "w.pt", 1.0)
    plain = plan_of(tmp_path, *QUIET, "method=pretrained", f"model.init_from={weights}")
    other = plan_of(tmp_path, *QUIET, "method=pretrained", f"model.init_from={weights}", "schedule=cosine",
                    "optimizer.momentum=0.5", "trainer.epochs=6", "model.lr=0.3", "loss.label_smoothing=0.1")
    assert other.identity == plain.identity and other.run_dir == plain.run_dir
    assert not [k for k in plain.identity if k.split(".")[0] in ("optimizer", "schedule", "loss", "trainer")]
    assert plain.run_dir.parent.name.startswith("model.init_from-sha256-")
    made_before = {**plain.identity, "optimizer.momentum": 0.9, "trainer.epochs": 0}
    assert differences(plain.identity, made_before) == []  # a pretrained run recorded before this rule: the same run


# -- a run directory model.init_from names is its source run: its config and whether it is this run's seed ----------

SGD_SOURCE = [*QUIET, "method=sgd", "trainer.epochs=3"]


def finished_run(plan) -> Path:
    """The run ``plan`` plans, finished as far as its identity goes: its ``identity.json`` (as training writes it)
    and its metrics, where ``plan`` places it."""
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / "identity.json").write_text(json.dumps(record(plan.identity, plan.settings)))
    (plan.run_dir / "metrics.json").write_text(json.dumps({"sgd": {"acc": 50.0}}))
    return plan.run_dir


def laplace_from(out: Path, source: Path | str, seed: int):
    return plan_of(out, *QUIET, "method=laplace", f"model.init_from={source}", f"seed={seed}", "dataset.val_size=20")


def test_the_seeds_of_a_laplace_config_each_started_from_its_own_seeds_run_share_one_group(tmp_path):
    """The report's one Laplace cell of n seeds: seed k starts from the SGD run of seed k, and the source counts as
    its config (its group hash), not as its path, which names the seed."""
    sources = [finished_run(plan_of(tmp_path / "src", *SGD_SOURCE, f"seed={s}")) for s in (0, 1, 2)]
    runs = [laplace_from(tmp_path / "out", source, seed) for seed, source in enumerate(sources)]
    sgd_group = group_hash(json.loads((sources[0] / "identity.json").read_text())["identity"])
    assert {run.identity["model.init_from"] for run in runs} == {f"run-{sgd_group}"}
    assert len({group_hash(run.identity) for run in runs}) == 1
    assert {run.run_dir.parent for run in runs} == {runs[0].run_dir.parent}  # one directory of seeds
    assert runs[0].run_dir.relative_to(tmp_path / "out").as_posix() == (
        f"digits/preresnet20/laplace/dataset.val_size-20+model.init_from-run-{sgd_group}/seed0")
    assert SAFE_NAME.match(runs[0].run_dir.as_posix())
    assert label_of(runs[0].settings) == f"dataset.val_size=20, model.init_from=run-{sgd_group}"  # its row label
    other = finished_run(plan_of(tmp_path / "src", *SGD_SOURCE, "trainer.epochs=4", "seed=1"))
    assert group_hash(laplace_from(tmp_path / "out", other, 1).identity) != group_hash(runs[0].identity)


def test_a_run_started_from_another_seeds_run_is_another_experiment_naming_that_seed(tmp_path):
    seed0 = finished_run(plan_of(tmp_path / "src", *SGD_SOURCE, "seed=0"))
    own = laplace_from(tmp_path / "out", seed0, 0)
    crossed = laplace_from(tmp_path / "out", seed0, 1)  # seed 1 from seed 0's run
    assert crossed.identity["model.init_from"] == own.identity["model.init_from"] + "-seed0"
    assert group_hash(crossed.identity) != group_hash(own.identity)
    assert crossed.run_dir.parent != own.run_dir.parent and SAFE_NAME.match(crossed.run_dir.as_posix())


def test_a_source_run_is_the_same_however_its_folder_is_spelled_and_wherever_it_lies(tmp_path, monkeypatch):
    source = finished_run(plan_of(tmp_path / "src", *SGD_SOURCE))
    out = tmp_path / "out"
    absolute = laplace_from(out, source, 0)
    monkeypatch.chdir(tmp_path)
    relative = laplace_from(out, source.relative_to(tmp_path), 0)
    slash = laplace_from(out, f"{source}/", 0)
    dotted = laplace_from(out, f"{tmp_path}/./src/../src/{source.relative_to(tmp_path / 'src')}", 0)
    moved = shutil.copytree(source, tmp_path / "elsewhere" / "sgd_seed0")
    shutil.rmtree(source)
    there = laplace_from(out, moved, 0)
    for other in (relative, slash, dotted, there):
        assert other.identity == absolute.identity and other.run_dir == absolute.run_dir


def test_an_epoch_picked_from_a_source_run_is_kept_in_its_identity_and_its_name(tmp_path):
    source = finished_run(plan_of(tmp_path / "src", *SGD_SOURCE))
    whole = plan_of(tmp_path / "out", *QUIET, "method=sgd", f"model.init_from={source}")
    at2 = plan_of(tmp_path / "out", *QUIET, "method=sgd", f"model.init_from={source}@2")
    at3 = plan_of(tmp_path / "out", *QUIET, "method=sgd", f"model.init_from={source}@3")
    assert at2.identity["model.init_from"] == whole.identity["model.init_from"] + "@2"
    assert len({whole.run_dir, at2.run_dir, at3.run_dir}) == 3
    assert at2.run_dir.parent.name == f"model.init_from-{whole.identity['model.init_from']}-epoch2"
    cfg = compose_hydra(*QUIET, f"model.init_from={at2.run_dir}@1")  # the name still passes unquoted
    assert cfg.model.init_from == f"{at2.run_dir}@1"


def test_a_path_that_names_no_source_run_stays_a_path(tmp_path):
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        resolved = {"seed": 0, "model": {"init_from": str(path)}}
        assert identity_of(resolved)["model.init_from"] == str(path)


def test_a_run_that_recorded_its_source_runs_path_is_the_same_run_and_renamed_by_the_upgrade(tmp_path):
    """Identities of version 3 held the run directory's path, and named the directory by it: that run is the same
    run today while its source lies where it did (it is read as its source run); the upgrade renames its directory,
    where it is then skipped when finished."""
    source = finished_run(plan_of(tmp_path / "src", *SGD_SOURCE))
    out = tmp_path / "out"
    today = laplace_from(out, source, 0)
    then = earlier_record(today, version=3)
    assert then["identity"]["model.init_from"] == str(source)
    assert differences(today.identity, then["identity"]) == []  # read under today's rules: the same run
    old_dir = earlier_dir(out, today, then)
    assert old_dir != today.run_dir
    old_dir.mkdir(parents=True)
    (old_dir / "identity.json").write_text(json.dumps(then))
    (old_dir / "metrics.json").write_text(json.dumps({"laplace": {"acc": 50.0}}))
    upgraded(out)
    found = laplace_from(out, source, 0)
    assert found.run_dir == today.run_dir and found.finished == {"laplace": {"acc": 50.0}}


# -- what only says what a run keeps never counts (identity.OUTPUT_ONLY: model.fge.save_members) -----------------

FGE = [*QUIET, "method=fge"]


def test_keeping_fges_members_is_the_same_run_group_directory_and_row_label(tmp_path):
    """``model.fge.save_members`` only writes the members' weights too: with it or without, one identity, one group,
    one directory (no ``save_members`` in its name) and one report label, beside another setting too."""
    for extra in ([], ["model.fge.cycle_epochs=4"]):
        kept, plain = (plan_of(tmp_path, *FGE, *extra, f"model.fge.save_members={v}") for v in ("true", "false"))
        default = plan_of(tmp_path, *FGE, *extra)
        assert kept.identity == plain.identity == default.identity and "model.fge.save_members" not in kept.identity
        assert group_hash(kept.identity) == group_hash(plain.identity)
        assert kept.run_dir == plain.run_dir == default.run_dir and "save_members" not in kept.run_dir.as_posix()
        assert kept.settings == plain.settings and label_of(kept.settings) == label_of(default.settings)
    assert kept.run_dir.relative_to(tmp_path).as_posix() == "digits/preresnet20/fge/fge.cycle_epochs-4/seed0"


def as_recipe_blocks(identity: dict, cfg) -> dict:
    """``identity`` as versions 2 to 5 held it: each method key that reads a recipe block (``method.lr_max:
    ${model.fge.lr_max}``) under that block's key (``model.fge.lr_max``)."""
    read = {k: str(cfg.method._get_node(k.split(".", 1)[1])._value())[2:-1]
            for k in identity if k.startswith("method.") and str(cfg.method._get_node(k.split(".", 1)[1])._value()
                                                                   ).startswith("${model.")}
    return {read.get(k, k): v for k, v in identity.items()}


def version_4_record(plan) -> dict:
    """The identity.json identity version 4 wrote for ``plan``'s config: FGE's settings as ``model.fge.*``,
    ``model.fge.save_members`` counted."""
    resolved = OmegaConf.to_container(plan.cfg, resolve=True)
    then = {**as_recipe_blocks(identity_of(resolved, plan.identity.get("data.fingerprint")), plan.cfg),
            "model.fge.save_members": bool(plan.cfg.model.fge.save_members)}
    apart = {**plan.settings, "model.fge.save_members": True} if then["model.fge.save_members"] else plan.settings
    return {"version": 4, "hash": "x", "group": group_hash(then), "identity": then, "apart": apart}


def test_an_identity_that_counted_save_members_is_todays_run(tmp_path):
    today = plan_of(tmp_path, *FGE, "model.fge.save_members=true")
    then = version_4_record(today)
    assert then["identity"]["model.fge.save_members"] is True
    assert differences(today.identity, then["identity"]) == []
    assert differences(then["identity"], today.identity) == []
    run = tmp_path / "old"
    run.mkdir()
    (run / "identity.json").write_text(json.dumps(then))
    assert stored_identity(run) == today.identity  # its group hash too
    from swalab.results.runs import Run

    assert Run(run).apart == {}  # no report row label of its own


def test_a_run_named_with_save_members_by_identity_version_4_is_renamed_by_the_upgrade_then_skipped(tmp_path):
    """Version 4 named the run ``fge.save_members-True``: the upgrade renames it to today's name, where the same
    command skips it when finished, and a row finds it there as run.py does."""
    from swalab.results.row import compose_run, run_dir_of

    out = tmp_path / "out"
    for extra, then_name in (([], "fge.save_members-True"),
                             (["model.fge.cycle_epochs=4"], "fge.cycle_epochs-4+fge.save_members-True")):
        args = [*FGE, *extra, "model.fge.save_members=true"]
        today = plan_of(out, *args)
        old = out / "digits/preresnet20/fge" / then_name / "seed0"
        assert today.run_dir != old and earlier_dir(out, today, version_4_record(today)) == old
        old.mkdir(parents=True)
        (old / "identity.json").write_text(json.dumps(version_4_record(today)))
        (old / "metrics.json").write_text(json.dumps({"fge": {"acc": 50.0, "members": 2}}))
        (old / "config.yaml").write_text(OmegaConf.to_yaml(today.cfg, resolve=True))  # as every run holds one
        with pytest.raises(ConfigError, match="python -m swalab.upgrade"):
            plan_of(out, *args)
        upgraded(out)
        done = plan_of(out, *args)
        assert done.run_dir == today.run_dir and done.skips
        overrides = [*args, f"paths.output_dir={out}"]
        assert run_dir_of(compose_run(overrides), overrides) == today.run_dir.resolve()
    assert not (out / "digits/preresnet20/fge/fge.save_members-True").exists()


def test_runs_of_identity_version_5_are_upgraded_in_place_or_renamed_then_skipped(tmp_path):
    """Version 5 held SWA's settings as the recipe block's keys (``model.swa.lr``) and named a setting by the key
    typed even when it only reads another: ``schedule.lr=0.07`` in ``schedule.lr-0.07``, ``model.lr=0.07`` in
    ``model.lr-0.07``, one config under two names. Its run under today's name is today's run as it is; one under a
    name of the key typed is renamed by the upgrade to today's (``model.lr-0.07``), where the same command skips it."""
    from swalab.identity import IDENTITY_VERSION

    out = tmp_path / "out"
    for args, then_apart, then_name in ((["schedule.lr=0.07"], {"schedule.lr": 0.07}, "schedule.lr-0.07"),
                                        (["model.swa.lr=0.03"], {"model.swa.lr": 0.03}, "swa.lr-0.03"),
                                        # sorted by the key counted: model.swa.lr, then schedule.lr (shown model.lr)
                                        (["model.swa.lr=0.04", "model.lr=0.07"], {"model.swa.lr": 0.04,
                                                                                   "model.lr": 0.07},
                                         "swa.lr-0.04+model.lr-0.07")):
        today = plan_of(out, *QUIET, "method=swa", *args)
        then = as_recipe_blocks(today.identity, today.cfg)
        assert then != today.identity and "model.swa.lr" in then
        old = out / "digits/preresnet20/swa" / then_name / "seed0"
        old.mkdir(parents=True)
        (old / "identity.json").write_text(json.dumps({"version": 5, "hash": "x", "group": group_hash(then),
                                                       "identity": then, "apart": then_apart}))
        (old / "metrics.json").write_text(json.dumps({"swa": {"acc": 50.0}}))
        (old / "config.yaml").write_text(OmegaConf.to_yaml(today.cfg, resolve=True))
        if old == today.run_dir:  # today's name: today's run as it is, before any upgrade
            assert plan_of(out, *QUIET, "method=swa", *args).skips
        else:
            with pytest.raises(ConfigError, match=re.escape(f"{then_name}/seed0, named by an earlier swalab") + ".*python -m swalab.upgrade"):
                plan_of(out, *QUIET, "method=swa", *args)
        upgraded(out)
        done = plan_of(out, *QUIET, "method=swa", *args)
        assert done.run_dir == today.run_dir and done.skips
        record = json.loads((done.run_dir / "identity.json").read_text())
        assert record["version"] == IDENTITY_VERSION and record["identity"] == today.identity
    assert sorted(p.name for p in (out / "digits/preresnet20/swa").iterdir()) == [
        "model.lr-0.07", "model.lr-0.07+swa.lr-0.04", "swa.lr-0.03"]


def test_a_finished_run_that_kept_no_members_is_skipped_saying_so(tmp_path, caplog):
    """Keeping the members sets no run apart, so a run finished without them is skipped: said, with what to do."""
    plain = plan_of(tmp_path, *FGE)
    finished = finished_run(plain)
    (finished / "metrics.json").write_text(json.dumps({"fge": {"acc": 50.0, "members": 2}}))
    caplog.clear()
    kept = plan_of(tmp_path, *FGE, "model.fge.save_members=true")
    assert kept.run_dir == finished and kept.skips
    assert "kept the weights of 0 of its 2 members" in caplog.text and "run.dir=<dir>" in caplog.text
    caplog.clear()
    assert plan_of(tmp_path, *FGE).skips and "members" not in caplog.text  # not asked to keep them: nothing to say


def test_fge_with_and_without_save_members_runs_once(tmp_path):
    """``python run.py method=fge model.fge.save_members=true`` twice: trained once (its member kept), then
    skipped; without the setting it is the same run, skipped too."""
    out = tmp_path / "out"
    args = [*TINY, "method=fge", "trainer.epochs=4", "model.fge.pretrain_epochs=2", f"paths.output_dir={out}"]
    first = cli(*args, "model.fge.save_members=true", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    [run] = [p.parent for p in out.rglob("metrics.json")]
    assert "save_members" not in run.as_posix() and len(list((run / "members").glob("member_*.pt"))) == 1
    for value in ("true", "false"):
        again = cli(*args, f"model.fge.save_members={value}", cwd=tmp_path)
        assert again.returncode == 0 and "skipping" in again.stdout, again.stderr[-3000:]
    assert [p.parent for p in out.rglob("metrics.json")] == [run]
