"""The README's grids over methods give a table that compares: every method of a grid has the same budget B (so each
column is paired with the SGD run of its seed), FGE collects an ensemble, and the README's short grid, run here at a
tiny size, reports every column against SGD and section 3.5 compared."""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO
from swalab.train import validate

README = (REPO / "README.md").read_text()
SHORT = re.compile(r"<!-- grid: short -->\n```bash\n(.*?)```", re.S)


def grid_commands(text: str) -> list[list[str]]:
    """Every ``python run.py -m ... method=a,b ...`` in ``text`` (code blocks and inline code), as its arguments
    after ``run.py``, where the config composes from conf/ alone (no ``--config-dir``, no ``experiment=``)."""
    commands = []
    for match in re.finditer(r"python run\.py -m ([^`#\n]*)", text.replace("\\\n", " ")):
        args = shlex.split(match.group(1))
        methods = next((a.split("=", 1)[1] for a in args if a.startswith("method=")), "")
        if "," in methods and not any(a.startswith(("--", "experiment=", "+")) for a in args):
            commands.append(args)
    return commands


def jobs_of(args: list[str]) -> dict[str, list[str]]:
    """The overrides of each method's first job of a grid (a list of values other than the methods': its first)."""
    fixed = [a if "," not in a or a.startswith("method=") else a.split(",")[0] for a in args if "=" in a]
    methods = next(a for a in fixed if a.startswith("method=")).split("=", 1)[1].split(",")
    return {m: [a for a in fixed if not a.startswith("method=")] + [f"method={m}"] for m in methods}


def test_the_readme_holds_a_short_grid_and_more_grids_over_methods():
    assert SHORT.search(README), "the README's short grid (<!-- grid: short -->) is missing"
    assert len(grid_commands(README)) >= 2


@pytest.mark.parametrize("args", grid_commands(README), ids=lambda a: " ".join(a))
def test_every_method_of_a_readme_grid_has_the_same_budget_so_each_column_pairs_with_sgd(make_cfg, args):
    budgets = {}
    for method, overrides in jobs_of(args).items():
        cfg = make_cfg(*overrides)
        trained = validate(cfg)
        budgets[method] = cfg.trainer.epochs / cfg.method.budget
        assert trained.caveats() == [], f"{method}: {trained.caveats()}"  # FGE: an ensemble, not one snapshot
    assert len(set(budgets.values())) == 1, f"B per method: {budgets}"


def test_the_readme_short_grid_run_tiny_reports_every_column_against_sgd_and_section_35(tmp_path):
    """The README's two commands as written, plus what makes them tiny (fewer images, a shallower network, one seed)."""
    grid, report = [shlex.split(line) for line in SHORT.search(README).group(1).replace("\\\n", " ").splitlines()]
    tiny = ["seed=0", "dataset.train_size=128", "model.arch.depth=8", "logger=none", "run.progress=false",
            f"paths.output_dir={tmp_path}/outputs"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    grid = [sys.executable, *grid[1:], *tiny]
    done = subprocess.run(grid, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, *report[1:3], str(tmp_path / "outputs"), "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert "no SGD run of B" not in table and "1 member" not in table
    with (out / "table.csv").open() as f:
        columns = {r["column"] for r in csv.DictReader(f) if r["metric"] == "acc"}
    assert columns == {"SGD 1B (16 ep)", "FGE 1B (16 ep)", "SWA 1.5B (24 ep)", "EMA 1B (16 ep)"}
    paired = table.split("## Paired differences against SGD")[1].split("\n## ")[0]
    assert paired.count("−") >= 3 and "not run" not in paired
    section35 = table.split("## Section 3.5")[1].split("\n## ")[0]
    assert "SWA 1.5B (24 ep) vs the FGE 1B (16 ep) ensemble" in section35 and "not compared" not in section35
