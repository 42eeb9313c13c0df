"""A small-scale reproduction of the paper on CPU: SGD vs SWA vs FGE vs EMA with the same epochs.

    python bench/repro_small.py                                   # PreResNet-20, 10k images, 16 epochs, 2 seeds
    python bench/repro_small.py --train-size 5000 --epochs 8      # quicker

Every run goes through the normal config path (``hydra.compose`` of ``conf/`` + ``swalab.train.train``),
so each is an ordinary run directory under ``--out`` that ``python -m swalab.results.compare`` can read. All
methods get the same number of epochs E and the base schedule ``paper_sgd`` over E epochs:

* sgd: the base schedule;
* swa: the reference pre-schedule until ``swa_start = 0.75 E``, then a constant ``--swa-lr``;
* fge: SGD (base schedule) for 0.75 E epochs, then triangular cycles of 2 epochs (members saved);
* ema: the base schedule with an EMA of the weights (timm ModelEmaV3, warmup on).

It prints a table of test accuracy / NLL / ECE (mean ± std over seeds) and the paper's section 3.5
diagnostics (FGE members, SWA vs the FGE ensemble) as JSON; both are also written to ``--out``.
With 10k images and 16 epochs it takes about an hour on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
DEFAULT_DATA = str(REPO.parent / "shared" / "data" / "cifar10-jpg")  # the real JPEG copy beside the repository

import swalab  # noqa: E402,F401  (registers the config resolvers)
from swalab.results.compare import compare  # noqa: E402
from swalab.train import train  # noqa: E402

METHODS = ("sgd", "swa", "fge", "ema")


def method_overrides(method: str, epochs: int, swa_lr: float) -> list[str]:
    start = max(1, round(0.75 * epochs))
    if method == "swa":
        return [f"model.swa.start_epoch={start}", f"model.swa.lr={swa_lr}"]
    if method == "fge":
        return [f"model.fge.pretrain_epochs={start}", "model.fge.cycle_epochs=2", f"model.fge.lr_max={swa_lr}",
                f"model.fge.lr_min={swa_lr / 10:g}", "model.fge.save_members=true"]
    return []


def run_one(method: str, seed: int, args) -> Path:
    run_dir = Path(args.out) / f"seed{seed}" / method
    overrides = ["logger=none", "run.progress=false", "dataset=cifar10", f"dataset.root={args.root}",
                 "run.download=false", f"dataset.train_size={args.train_size}", f"model={args.model}",
                 f"method={method}", f"trainer.epochs={args.epochs}", "run.eval_every=0", f"seed={seed}",
                 *method_overrides(method, args.epochs, args.swa_lr)]
    if args.cache_dir:
        overrides.append(f"run.cache_dir={args.cache_dir}")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    t0 = time.perf_counter()
    train(cfg, run_dir=run_dir)
    print(f"[repro] {method} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def summarize(results: list[dict]) -> tuple[str, dict]:
    """Markdown table (mean ± std over seeds per predictor) and the section 3.5 numbers per seed."""
    rows: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for name, m in result["predictors"].items():
            method, predictor = name.split("/seed")[0], name.rsplit("/", 1)[1]
            row = rows.setdefault(f"{method}: {predictor}", {"acc": [], "nll": [], "ece": []})
            for key in row:
                row[key].append(m[key])
    lines = ["| predictor | test acc % | NLL | ECE | seeds |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {mean_std(row['acc'])} | {mean_std(row['nll'])} | {mean_std(row['ece'])} "
                     f"| {len(row['acc'])} |")
    diag = {}
    for result in results:
        for ens, d in result["section35"].items():
            diag[ens] = {"members": d["members"],
                         "consecutive_mean_l2": d["consecutive"]["mean_l2"] if d["consecutive"] else None,
                         "consecutive_max_agreement": d["consecutive"]["max_agreement"] if d["consecutive"] else None,
                         "vs_ensemble": d["vs_ensemble"]}
    return "\n".join(lines), diag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_DATA, help="CIFAR-10 (pickles or image folder)")
    parser.add_argument("--cache-dir", default=None,
                        help="writable folder for the decoded-image cache (needed when --root is read-only or shared)")
    parser.add_argument("--train-size", type=int, default=10000, help="training images (class-stratified subset)")
    parser.add_argument("--epochs", type=int, default=16, help="epochs for every method")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--model", default="preresnet20")
    parser.add_argument("--swa-lr", type=float, default=0.05, help="SWA's constant lr and FGE's a1 (a2 = a1 / 10)")
    parser.add_argument("--out", default="outputs/repro_small", help="where the run directories go")
    args = parser.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    results = []
    for seed in args.seeds:
        dirs = [run_one(method, seed, args) for method in METHODS]
        results.append(compare(dirs, device="auto"))
    table, diag = summarize(results)
    minutes = (time.perf_counter() - t0) / 60
    print(f"\n{args.model}, CIFAR-10 train_size={args.train_size}, {args.epochs} epochs, seeds {args.seeds} "
          f"({minutes:.1f} min on {platform.machine()}, {torch.get_num_threads()} threads)\n")
    print(table)
    print("\nsection 3.5 diagnostics (paper: 0.126 / <= 87.33% consecutive; 0.079 / 95.26% SWA vs FGE):")
    print(json.dumps(diag, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), "minutes": minutes, "table": table,
                                                  "section35": diag, "compare": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
