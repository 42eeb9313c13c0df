"""Bytes of a run's last checkpoint per model and method, and of the other files its method wrote, against a
baseline commit.

A checkpoint is rewritten every epoch (``run.checkpoint_every``), so whatever it carries is written again and
again, and under data-parallel training every rank waits while rank 0 fsyncs it. This measures, per model of
``conf/model`` (on its Table-1 data set sizes: CIFAR-100's 10,000 test images x 100 classes; ImageNet's 50,000
x 1,000 for ``resnet50``) and per method (SWA with the budget marks 1B and 1.25B scored as their own
predictors, FGE with the members its recipe collects), the checkpoint the trainer writes after the last epoch
(``Trainer.save``) and every other file the method wrote into the run directory on the way.

No network is trained: the model is built, one optimizer step with zero gradients gives SGD its momentum
buffers (as any trained run has), and the method's hooks run for every epoch of the paper's schedule
(``trainer.epochs`` of the composed config) with the test pass replaced by random log-probabilities of the
right shape and the BN update by nothing; captures, members and budget marks happen where they would. The
sizes therefore are those of a real run of that config; the weights' values are not.

The baseline (``--baseline``, default: the merge base with ``main``) is the same child code run against that
commit's ``src/`` and ``conf/``, exported with ``git archive`` into a temporary folder.

Usage::

    python bench/checkpoint_size.py                 # every CIFAR model on CIFAR-100 sizes, and resnet50 on ImageNet's
    python bench/checkpoint_size.py --models wrn28_10 --methods swa
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import CIFAR_MODELS, ROOT, machine_info, paper_sgd_trainer, write_result  # noqa: E402

DATASETS = {"cifar100": (10_000, 100), "imagenet": (50_000, 1_000)}
MODELS = {**{m: "cifar100" for m in CIFAR_MODELS}, "resnet50": "imagenet"}


def child(conf: Path, model_name: str, method_name: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from swalab.train.build import build_method

    dataset = MODELS[model_name]
    n_test, classes = DATASETS[dataset]
    overrides = [f"model={model_name}", f"dataset={dataset}", f"method={method_name}", "logger=none"]
    if method_name == "swa":
        overrides.append("model.swa.score_at_budgets=[1.0,1.25]")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    epochs = int(cfg.trainer.epochs)
    method = build_method(cfg, epochs)
    torch.manual_seed(0)
    if cfg.model.arch.get("model_name"):
        import timm

        model = timm.create_model(str(cfg.model.arch.model_name), pretrained=False, num_classes=classes)
    else:
        model = instantiate(cfg.model.arch, num_classes=classes, in_channels=3)

    class Batches(list):  # a loader of one training step per epoch; the test labels known up front
        labels = torch.randint(0, classes, (n_test,))

    with tempfile.TemporaryDirectory(prefix="swalab-ckpt-") as tmp:
        decay = float(cfg.optimizer.weight_decay if "optimizer" in cfg else cfg.trainer.weight_decay)
        trainer = paper_sgd_trainer(model, method, Batches([None]), Batches(), Batches(), torch.device("cpu"), tmp,
                                    weight_decay=decay, epochs=epochs, progress=False, handle_signals=False)
        trainer.ctx.test_log_probs = lambda m: torch.randn(n_test, classes).log_softmax(1)
        trainer.ctx.update_bn = lambda m: None
        for p in trainer.model.parameters():  # one step: SGD's momentum buffers exist, as in any trained run
            p.grad = torch.zeros_like(p)
        trainer.optimizer.step()
        method.on_train_start(trainer.ctx)
        for epoch in range(epochs):
            method.on_step_end(trainer.ctx, epoch, 0)
            method.on_epoch_end(trainer.ctx, epoch)
        path = trainer.save(epochs)
        others = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(Path(tmp).rglob("*"))
                  if p.is_file() and p != path and p.name != "history.jsonl"}
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        return {"model": model_name, "method": method_name, "dataset_sizes": f"{n_test} x {classes}",
                "epochs": epochs, "parameter_bytes": params, "checkpoint_bytes": path.stat().st_size,
                "other_files_bytes": sum(others.values()), "other_files": len(others),
                "predictions_cached": _cached(method)}


def _cached(method) -> int:
    """How many test-set predictions the method holds (FGE members, SWA budget marks)."""
    ensemble = getattr(method, "ensemble", None)
    return len(ensemble) if ensemble is not None else len(getattr(method, "budget_log_probs", {}))


def export(commit: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"swalab-{commit[:8]}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "src", "conf"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def run_child(tree: Path, model: str, method: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, "--child", str(tree / "conf"), model, method]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return {"model": model, "method": method, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child(Path(argv[1]), argv[2], argv[3])))
        return {}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--methods", nargs="+", default=["swa", "fge"])
    p.add_argument("--baseline", default=None, help="commit to compare with (default: merge base with main)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    baseline = args.baseline or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True,
                                               text=True, check=True).stdout.strip()
    sides = {"before": export(baseline), "after": ROOT}
    rows = []
    for model in args.models:
        for method in args.methods:
            row = {"model": model, "method": method}
            for side, tree in sides.items():
                got = run_child(tree, model, method)
                row[side] = {k: v for k, v in got.items() if k not in ("model", "method")}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    payload = {"benchmark": "checkpoint_size", "baseline_commit": baseline,
               "command": "python bench/checkpoint_size.py " + " ".join(argv),
               "machine": machine_info(torch.device("cpu")), "results": rows}
    write_result("checkpoint_size", torch.device("cpu"), payload, args.out)
    return payload


if __name__ == "__main__":
    main()
