"""Adding a method is two files of the user's own: a strategy class and a config. Nothing in swalab changes.

The method here, ``Polyak``, keeps a running average of every iterate after the first half of the run (a
plain Polyak-Ruppert average, BN statistics recomputed) and hands it back as its own predictor. It is written
into a temporary directory with its config, and trained through ``run.py`` exactly as a user would, with
``--config-dir`` and ``PYTHONPATH``; the report then puts it in its own column.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

from conftest import REPO

METHOD = textwrap.dedent('''
    import copy

    from torch.optim.swa_utils import AveragedModel

    from swalab.evaluate import ModelPredictor
    from swalab.methods import Method


    class Polyak(Method):
        name = "polyak"

        def __init__(self, schedule, epochs, budget=1.0, name=None, start=0.5):
            super().__init__(schedule, epochs, budget, name)
            self.start = self.epoch_of(start)
            self.average = None

        def on_train_start(self, ctx):
            self.average = AveragedModel(ctx.model)

        def on_step_end(self, ctx, epoch, step):
            if epoch >= self.start:
                self.average.update_parameters(ctx.model)

        def predictors(self, ctx):
            ctx.update_bn(self.average.module)
            return {"polyak": ModelPredictor(self.average.module, ctx.device),
                    "sgd": ModelPredictor(ctx.model, ctx.device)}

        def final_weights(self):
            return {"polyak": copy.deepcopy(self.average.module.state_dict())}

        def state_dict(self):
            return {"average": self.average.state_dict()}

        def load_state_dict(self, state, ctx):
            self.average.load_state_dict(state["average"])
''')
CONFIG = textwrap.dedent('''
    _target_: polyak.Polyak
    name: polyak     # short name used in run directories and reports
    budget: 1.0      # the run's length in budgets B
    start: 0.5       # average every step after this fraction of B
''')


def test_a_new_method_is_one_module_and_one_config(tmp_path):
    (tmp_path / "polyak.py").write_text(METHOD)
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "polyak.yaml").write_text(CONFIG)
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])  # the swalab under test too
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    args = ["--config-dir", str(tmp_path / "conf"), "method=polyak", "logger=none", "trainer.epochs=4",
            "dataset.train_size=256", "trainer.batch_size=64", "model.arch.depth=8", f"paths.output_dir={tmp_path / 'out'}"]
    done = subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "polyak" in done.stdout and "epoch 4/4" in done.stdout
    report = subprocess.run([sys.executable, "-m", "swalab.results.report", str(tmp_path / "out"), "--out",
                             str(tmp_path / "report")], env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    with (tmp_path / "report" / "table.csv").open() as f:
        columns = {r["column"] for r in csv.DictReader(f)}
    assert columns == {"Polyak 1B (4 ep)"}


def test_a_new_method_has_its_run_in_a_row_and_its_column_after_the_built_in_ones(tmp_path, monkeypatch):
    """The same two files, and nothing else: ``python -m swalab.results.row --method polyak`` plans a Polyak run
    beside SGD, SWA and FGE (trained straight through: it declares no later branch point) and records its column
    after theirs, named as the report names it."""
    from swalab.results.row import manifest_of, plan_row

    (tmp_path / "polyak.py").write_text(METHOD)
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "polyak.yaml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    jobs = plan_row("digits", "preresnet20", 0, ["logger=none", "model.budget_epochs=8", "model.swa.start_epoch=6",
                                                 f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                                                 f"paths.output_dir={tmp_path / 'out'}"], methods=("polyak", "fge"))
    assert [j.name for j in jobs] == ["sgd", "swa", "polyak", "fge"]
    polyak = jobs[2]
    assert "method=polyak" in polyak.overrides and polyak.parent is None and polyak.columns == {"Polyak 1B": "polyak"}
    assert list(manifest_of(jobs, tmp_path / "out")) == ["SGD", "FGE 1B", "SWA 1B", "SWA 1.25B", "SWA 1.5B",
                                                         "Polyak 1B"]


def test_a_method_of_ones_own_stands_after_the_built_in_ones_in_the_report_whatever_its_name(tmp_path):
    """``averaged`` sorts before ``ema`` and ``sgd`` by name; the report still puts the paper's methods first."""
    from test_report import m, make_run, table_lines

    from swalab.results.report import report

    for seed in (0, 1):
        make_run(tmp_path / "runs", "averaged", seed, {"averaged": m(91.0), "sgd": m(80.0)},
                 extra={"method": {"_target_": "averaged.Averaged"}})  # not importable here: read by its name
        make_run(tmp_path / "runs", "ema", seed, {"ema": m(90.5)})
        make_run(tmp_path / "runs", "sgd", seed, {"sgd": m(90.0)})
    report([tmp_path / "runs"], tmp_path / "out")
    assert table_lines(tmp_path / "out")[0] == "| row | SGD 1B (4 ep) | EMA 1B (4 ep) | Averaged 1B (4 ep) |"
