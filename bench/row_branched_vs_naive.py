"""Measure one Table 1 row trained branched (one SGD trunk, SWA and FGE branches) against naively.

    python bench/row_branched_vs_naive.py --train-per-class 100 --test-per-class 100 --budget 8 --seed 0 --out /tmp/rowbench

Runs ``python -m swalab.results.row`` twice on the CIFAR-10 JPEG copy (PreResNet-20, CPU), branched and
with ``--naive`` (five runs trained straight through), each in its own output directory, and
writes ``bench/results/row_branched_vs_naive.md``: epochs trained and wall time per job and in
total, and the row each mode gives (they must be identical).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path


from _common import DEFAULT_DATA
from swalab.results.row import main as row_main
from swalab.results.row import row_metrics

RESULTS = Path(__file__).resolve().parent / "results" / "row_branched_vs_naive.md"


def subset_folder(source: Path, target: Path, train_per_class: int, test_per_class: int) -> Path:
    """An image folder of symlinks to the first N images per class of ``source`` (sorted names).

    The shared copy is read-only, so its decode cache cannot be written there and every run would
    decode all 60,000 JPEGs; a small folder of links keeps its own cache and a small test set.
    """
    for split, n in (("train", train_per_class), ("test", test_per_class)):
        for class_dir in sorted((source / split).iterdir()):
            dst = target / split / class_dir.name
            dst.mkdir(parents=True, exist_ok=True)
            for f in sorted(class_dir.iterdir())[:n]:
                link = dst / f.name
                if not link.exists():
                    link.symlink_to(f)
    return target


def run_mode(args, naive: bool) -> tuple[dict, float]:
    out = Path(args.out) / ("naive" if naive else "branched")
    overrides = ["logger=none", "run.progress=false", f"dataset.root={args.root}", f"model.budget_epochs={args.budget}",
                 f"model.swa.start_epoch={round(0.75 * args.budget)}", "model.fge.pretrain=0.5", "run.eval_every=0",
                 f"paths.output_dir={out}"]
    argv = ["--dataset", "cifar10", "--model", "preresnet20", "--seeds", str(args.seed), *overrides]
    if naive:
        argv.append("--naive")
    t0 = time.perf_counter()
    record = row_main(argv)[args.seed]
    return record, time.perf_counter() - t0


def job_table(record: dict) -> list[str]:
    lines = ["| job | branches at epoch | epochs trained | seconds |", "|---|---|---|---|"]
    for c in record["launch"]:
        lines.append(f"| {c['name']} | {c['branch_epoch'] if c['branch_epoch'] is not None else '-'} | "
                     f"{c['epochs_trained']} | {c['seconds']:.0f} |")
    total_e = sum(c["epochs_trained"] for c in record["launch"])
    total_s = sum(c["seconds"] for c in record["launch"])
    lines.append(f"| **total** | | **{total_e}** | **{total_s:.0f}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--out", default="/tmp/rowbench")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the run.py subprocesses
    args.root = subset_folder(Path(args.data), Path(args.out) / "cifar10-subset", args.train_per_class,
                              args.test_per_class)
    branched, branched_wall = run_mode(args, naive=False)
    naive, naive_wall = run_mode(args, naive=True)
    rows = {mode: row_metrics(record["columns"], Path(record["root"]))
            for mode, record in (("branched", branched), ("naive", naive))}
    same = all(rows["branched"][c][k] == m[k] for c, m in rows["naive"].items()
               for k in m.keys() & rows["branched"][c].keys() if isinstance(m[k], (int, float)))
    lines = [
        "# One Table 1 row: branched off one SGD trunk vs five runs trained straight through",
        "",
        f"Command: `python bench/row_branched_vs_naive.py --train-per-class {args.train_per_class} "
        f"--test-per-class {args.test_per_class} --budget {args.budget} --seed {args.seed} --threads {args.threads}`",
        "",
        f"CIFAR-10 JPEG copy ({args.data}): the first {args.train_per_class} training and {args.test_per_class} "
        f"test images of each class ({10 * args.train_per_class} / {10 * args.test_per_class} images); PreResNet-20; "
        f"budget B = {args.budget} epochs; SWA from epoch {round(0.75 * args.budget)} at lr 0.01; FGE pretrain "
        f"0.5 B then cycle 2; run.eval_every=0; seed {args.seed}.",
        f"Machine: {platform.machine()} CPU, {args.threads} torch thread(s) per run, shared with other engineers' "
        "jobs (load average 8-15 on 2 cores while this ran: seconds are noisy, epoch counts exact). The branched "
        "row ran first, then the naive one.",
        "",
        "## Branched (`python -m swalab.results.row ...`)",
        "", *job_table(branched), "", f"Wall time of the whole command (composing configs, process starts): "
        f"{branched_wall:.0f} s.",
        "",
        "## Naive (`python -m swalab.results.row ... --naive`)",
        "", *job_table(naive), "", f"Wall time of the whole command: {naive_wall:.0f} s.",
        "",
        "## The row each gives (test set, %)",
        "",
        "| column | branched acc | naive acc | branched NLL | naive NLL | branched ECE | naive ECE |",
        "|---|---|---|---|---|---|---|",
    ]
    for column in rows["naive"]:
        b, n = rows["branched"][column], rows["naive"][column]
        lines.append(f"| {column} | {b['acc']:.2f} | {n['acc']:.2f} | {b['nll']:.4f} | {n['nll']:.4f} | "
                     f"{b['ece']:.4f} | {n['ece']:.4f} |")
    lines += ["", f"Every metric of every column identical (exact equality of every number both metrics.json entries hold): **{same}**.",
              ""]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
