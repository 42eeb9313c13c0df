"""The README's "Bring your own data and model" example, run as written: a folder of 28x28 grey PNGs written
by a script (not CIFAR), a model module of the user's own with a model config that starts from
conf/model/custom.yaml, an SGD/SWA grid through --config-dir and PYTHONPATH, and the report."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys

import torch

from conftest import REPO

EXAMPLE = re.compile(r"<!-- example: bring-your-own -->\n```bash\n(.*?)```", re.S)


def test_the_bring_your_own_example_runs_as_written(tmp_path):
    script = EXAMPLE.search((REPO / "README.md").read_text()).group(1)
    shutil.copy(REPO / "run.py", tmp_path / "run.py")  # the example runs from a checkout's root
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    images = sorted((tmp_path / "my_lab" / "digits28" / "train").rglob("*.png"))
    assert len(images) == 1437 and len({p.parent.name for p in images}) == 10
    runs = tmp_path / "my_lab" / "outputs" / "digits28" / "TinyCNN"
    first_conv = torch.load(next(runs.glob("sgd/*/seed0/final.pt")), weights_only=False)["model"]["0.0.weight"]
    assert first_conv.shape[1] == 1  # grey images: one input channel, found by looking at the files
    with (tmp_path / "my_lab" / "report" / "table.csv").open() as f:
        accuracy = {r["column"]: float(r["mean"]) for r in csv.DictReader(f) if r["metric"] == "acc"}
    assert set(accuracy) == {"SGD 1B (12 ep)", "SWA 1.5B (18 ep)"}
    assert min(accuracy.values()) > 80.0  # ten classes: chance is 10%
