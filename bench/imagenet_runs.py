"""ImageNet weights on CPU, through ``run.py`` as a user runs it: the pretrained model scored, and a short SWA fine-tune.

    python bench/imagenet_runs.py [--data ../shared/data/imagenette] [--test-size 491] [--train-size 320] [--epochs 2]

Two runs of ``run.py`` (``dataset=imagenet model=timm model.name=tf_efficientnet_lite0`` from the local weights
file), each timed from launch to exit, their ``metrics.json`` and ``history.jsonl`` read back:

* ``imagenet_pretrained_eval_cpu.json``: ``method=pretrained``, the weights scored 1000-way on ``--test-size``
  validation images (a class-stratified subset, seed 0);
* ``imagenet_finetune_cpu.json``: ``method=swa`` for ``--epochs`` epochs on ``--train-size`` training images from
  the same weights (the paper's cyclic SWA recipe, scaled down), scored on the same validation images.

imagenette's validation images are ImageNet validation images the weights never trained on. On 2 CPU cores
the defaults take about 15 to 25 minutes; each file records its commands, wall time and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import ROOT, SHARED_DATA, machine_info, write_result

WEIGHTS = SHARED_DATA / "weights" / "tf_efficientnet_lite0.in1k.pth"


def run(overrides: list[str], out: Path) -> dict:
    """``python run.py <overrides>`` into ``out``; its wall time, metrics and history."""
    command = [sys.executable, str(ROOT / "run.py"), *overrides, f"paths.output_dir={out}"]
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"[bench] {shlex.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    [metrics] = list(out.rglob("metrics.json"))
    path = metrics.parent / "history.jsonl"  # method=pretrained trains no epoch and writes none
    history = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {"command": "python run.py " + shlex.join(overrides), "wall_seconds": round(seconds, 1),
            "metrics": json.loads(metrics.read_text()), "history": history}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(SHARED_DATA / "imagenette"), help="an ImageNet folder (train/, val/)")
    p.add_argument("--weights", default=str(WEIGHTS))
    p.add_argument("--test-size", type=int, default=491)
    p.add_argument("--train-size", type=int, default=320)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    common = ["logger=none", "dataset=imagenet", f"dataset.root={args.data}", "model=timm",
              "model.name=tf_efficientnet_lite0", f"model.pretrained_file={args.weights}",
              f"dataset.test_size={args.test_size}", "run.eval_batch_size=64", "run.progress=false"]
    machine = machine_info(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        before = run([*common, "method=pretrained"], Path(tmp) / "pretrained")
        write_result("imagenet_pretrained_eval", torch.device("cpu"), {
            "benchmark": "imagenet_pretrained_eval", "machine": machine,
            "data": f"{args.test_size} of imagenette/val's 3,925 ImageNet validation images (class-stratified, "
                    "seed 0), scored 1000-way; the model's pretrained transforms", **before})
        swa = run([*common, "method=swa", f"dataset.train_size={args.train_size}", f"trainer.epochs={args.epochs}",
                   "trainer.batch_size=32", "run.eval_every=0", "trainer.bn_update_fraction=0.25"],
                  Path(tmp) / "swa")
        write_result("imagenet_finetune", torch.device("cpu"), {
            "benchmark": "imagenet_swa_finetune", "machine": machine,
            "data": f"train: {args.train_size} images of imagenette/train (seeded); val: the same {args.test_size} "
                    "images as imagenet_pretrained_eval", "before": before["metrics"], **swa})


if __name__ == "__main__":
    main()
