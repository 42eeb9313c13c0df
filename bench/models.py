"""Seconds per CIFAR epoch and peak memory of every CIFAR model, trained through swalab's Trainer.

Each model runs in its own subprocess (so CPU peak memory is its own): ``--warmup`` steps untimed, then
``--steps`` timed steps of ``Trainer.fit`` on random uint8 CIFAR-shaped data (the cost of a step does
not depend on the pixel values), extrapolated to a 50,000-image epoch. Peak memory is
``torch.cuda.max_memory_allocated`` on GPU and the growth of ``resource.getrusage(...).ru_maxrss``
over the run on CPU.

Usage::

    python bench/models.py --device cpu --batch-size 32 --steps 1        # every model, minutes
    python bench/models.py --device cuda --batch-size 128 --steps 20      # WRN-28-10 target: <= 10 s/epoch
    python bench/models.py --device cuda --models wrn28_10 --compile
    python bench/models.py --device cuda --nondeterministic   # the cost of run.deterministic: compare with the default
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (CIFAR_MODELS, TrainerBench, build_model, machine_info, pick_device,  # noqa: E402
                     random_split, write_result)

from swalab.models import count_parameters  # noqa: E402

TRAIN_IMAGES = 50_000
WRN_EPOCH_TARGET_S = 10.0


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def measure_one(name: str, device: torch.device, batch_size: int, steps: int, warmup: int, compile: bool,
                deterministic: bool = True) -> dict:
    """Time one model in this process; returns seconds per 50k epoch and peak memory."""
    torch.manual_seed(0)
    rss0 = maxrss_mib()
    model = build_model(name)
    params = count_parameters(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bench = TrainerBench(model, random_split((warmup + steps) * batch_size), batch_size, device, warmup,
                         compile=compile, deterministic=deterministic)
    images_per_s = bench.run()
    row = {"model": name, "params": params, "batch_size": batch_size, "timed_steps": steps,
           "step_seconds": bench.step_seconds(images_per_s), "images_per_s": images_per_s,
           "epoch_seconds_50k": TRAIN_IMAGES / images_per_s}
    if device.type == "cuda":
        row["peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        row["peak_memory_kind"] = "torch.cuda.max_memory_allocated"
    else:
        row["peak_memory_mib"] = maxrss_mib() - rss0
        row["peak_memory_kind"] = "ru_maxrss growth"
    return row


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--models", nargs="+", default=list(CIFAR_MODELS), help="conf/model names")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--nondeterministic", action="store_true",
                   help="run.deterministic=false: cuDNN autotuning instead of deterministic algorithms (CUDA only)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode: one model, JSON row out
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = pick_device(args.device)
    if args.one:
        print(json.dumps(measure_one(args.models[0], device, args.batch_size, args.steps, args.warmup, args.compile,
                                     not args.nondeterministic)))
        return {}
    rows = []
    for name in args.models:
        cmd = [sys.executable, __file__, "--one", "--device", str(device), "--models", name, "--batch-size",
               str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        cmd += ["--compile"] if args.compile else []
        cmd += ["--nondeterministic"] if args.nondeterministic else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append({"model": name, "error": proc.stderr.strip().splitlines()[-1:]})
        else:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr)
    payload = {
        "benchmark": "models",
        "command": "python bench/models.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"batch_size": args.batch_size, "timed_steps": args.steps, "warmup_steps": args.warmup,
                     "compile": args.compile, "amp_bf16": device.type == "cuda", "channels_last": True,
                     "deterministic": not args.nondeterministic,
                     "epoch": f"{TRAIN_IMAGES} images, extrapolated from the timed steps"},
        "models": rows,
    }
    wrn = next((r for r in rows if r["model"] == "wrn28_10" and "epoch_seconds_50k" in r), None)
    if device.type == "cuda" and wrn is not None:
        payload["target_wrn28_10_epoch"] = {"seconds_at_most": WRN_EPOCH_TARGET_S, "seconds": wrn["epoch_seconds_50k"],
                                            "pass": wrn["epoch_seconds_50k"] <= WRN_EPOCH_TARGET_S}
    write_result("models", device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
