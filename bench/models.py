"""Seconds per CIFAR epoch and peak memory of every CIFAR model, trained through swalab's Trainer.

Each model runs in its own subprocess (so CPU peak memory is its own): ``--warmup`` steps untimed, then
``--steps`` timed steps of ``Trainer.fit`` on random uint8 CIFAR-shaped data (the cost of a step does
not depend on the pixel values), extrapolated to a 50,000-image epoch (``epoch_seconds_50k``: training only).
An epoch as a user waits for it also scores the test set: the per-epoch test pass of ``Trainer._end_epoch``
(``swalab.evaluate.mean_loss_and_accuracy`` under the run's ``run.deterministic`` settings) over
``--test-images`` random images (10,000: CIFAR's test set) at the evaluation batch size ``run.eval_batch_size:
null`` resolves to (1000 on CUDA, 128 on CPU), timed after one warm-up pass, the median of ``--test-rounds``
(``test_pass_seconds_10k``, scaled to 10,000 images; ``epoch_with_test_seconds`` is the sum). Peak memory is
``torch.cuda.max_memory_allocated`` on GPU and the growth of ``resource.getrusage(...).ru_maxrss`` on CPU, over
the training steps (``peak_memory_mib``) and with the test passes (``peak_memory_with_test_mib``).

Usage::

    python bench/models.py --device cpu --batch-size 32 --steps 1 --warmup 1 --test-images 256 --test-rounds 1
    python bench/models.py --device cuda --batch-size 128 --steps 20 --warmup 5   # WRN-28-10 target: <= 10 s/epoch
    python bench/models.py --device cuda --warmup 5 --models wrn28_10 --compile
    python bench/models.py --device cuda --warmup 5 --nondeterministic  # the cost of run.deterministic
    python bench/models.py --device cuda --warmup 5 --cuda-graphs off   # the gain of run.cuda_graphs

On CUDA ``--warmup`` must exceed the eager steps before the Trainer captures its step as a CUDA graph
(``swalab.graphed.WARMUP_STEPS``, 3), unless ``--cuda-graphs off``: the capture is not timed.

A non-default variant (``--nondeterministic``, ``--precision``, ``--no-channels-last``, ``--cuda-graphs``,
``--compile``) is written to ``models_<variant>_<device>.json``, never over the default ``models_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (CIFAR_MEAN, CIFAR_MODELS, CIFAR_STD, TrainerBench, build_model, machine_info,  # noqa: E402
                     median, pick_device, random_split, timed, write_result)

from swalab.data import ResidentLoader  # noqa: E402
from swalab.evaluate import mean_loss_and_accuracy  # noqa: E402
from swalab.graphed import WARMUP_STEPS as GRAPH_WARMUP_STEPS  # noqa: E402
from swalab.models import count_parameters  # noqa: E402
from swalab.precision import deterministic as deterministic_flags  # noqa: E402
from swalab.precision import training_dtype  # noqa: E402
from swalab.train.build import eval_batch_size  # noqa: E402

TRAIN_IMAGES, TEST_IMAGES = 50_000, 10_000
WRN_EPOCH_TARGET_S = 10.0


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def peak_memory_mib(device: torch.device, rss0: float) -> float:
    """Peak memory so far (module doc): allocated on a GPU, resident-set growth over ``rss0`` on a CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else maxrss_mib() - rss0


def test_pass_seconds(model: torch.nn.Module, device: torch.device, images: int, channels_last: bool,
                      deterministic: bool, rounds: int) -> tuple[float, int]:
    """Seconds of the per-epoch test pass over ``images`` random images (module doc), and the batch size used."""
    batch = eval_batch_size(OmegaConf.create({"run": {"eval_batch_size": None}}), device)
    split = random_split(images, seed=1)
    loader = ResidentLoader(split, batch, train=False, device=device, mean=CIFAR_MEAN, std=CIFAR_STD,
                            channels_last=channels_last)
    with deterministic_flags(device, deterministic):  # Trainer._end_epoch runs inside fit's block
        times = [timed(lambda: mean_loss_and_accuracy(model, loader, device, labels=split.labels), device)
                 for _ in range(1 + rounds)]
    return median(times[1:]), batch


def measure_one(name: str, device: torch.device, batch_size: int, steps: int, warmup: int, compile: bool,
                deterministic: bool = True, precision: str = "auto", channels_last: bool = True,
                cuda_graphs: str = "auto", test_images: int = TEST_IMAGES, test_rounds: int = 3) -> dict:
    """Time one model in this process; returns seconds per 50k epoch, with a 10k test pass, and peak memory."""
    torch.manual_seed(0)
    rss0 = maxrss_mib()
    model = build_model(name)
    params = count_parameters(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bench = TrainerBench(model, random_split((warmup + steps) * batch_size), batch_size, device, warmup,
                         precision=precision, channels_last=channels_last, compile=compile,
                         deterministic=deterministic, cuda_graphs=cuda_graphs)
    images_per_s = bench.run()
    row = {"model": name, "params": params, "batch_size": batch_size, "timed_steps": steps,
           "precision": precision, "channels_last": channels_last, "cuda_graphs": cuda_graphs,
           "deterministic": deterministic, "compile": compile,
           "step_seconds": bench.step_seconds(images_per_s), "images_per_s": images_per_s,
           "epoch_seconds_50k": TRAIN_IMAGES / images_per_s,
           "peak_memory_mib": peak_memory_mib(device, rss0)}
    test_s, eval_batch = test_pass_seconds(bench.trainer.model, device, test_images, channels_last, deterministic,
                                           test_rounds)
    test_10k = test_s * TEST_IMAGES / test_images
    row.update({"eval_batch_size": eval_batch, "test_images_timed": test_images, "test_rounds": test_rounds,
                "test_pass_seconds_10k": test_10k, "epoch_with_test_seconds": row["epoch_seconds_50k"] + test_10k,
                "peak_memory_with_test_mib": peak_memory_mib(device, rss0),
                "peak_memory_kind": ("torch.cuda.max_memory_allocated" if device.type == "cuda"
                                     else "ru_maxrss growth")})
    return row


def variant_name(args) -> str:
    """The non-default settings, joined for the result file's name ('' for the default)."""
    parts = ["nondeterministic" if args.nondeterministic else "",
             f"precision_{args.precision}" if args.precision != "auto" else "",
             "nchw" if args.no_channels_last else "",
             f"cuda_graphs_{args.cuda_graphs}" if args.cuda_graphs != "auto" else "",
             "compile" if args.compile else ""]
    return "_".join(part for part in parts if part)


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
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="trainer.precision (auto: bf16 autocast on CUDA, fp32 elsewhere)")
    p.add_argument("--no-channels-last", action="store_true", help="run.channels_last=false (NCHW)")
    p.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                   help="run.cuda_graphs (auto: the Trainer's choice; passed only when not auto)")
    p.add_argument("--test-images", type=int, default=TEST_IMAGES,
                   help="images of the timed test pass (scaled to 10,000)")
    p.add_argument("--test-rounds", type=int, default=3, help="timed test passes after one warm-up; median")
    p.add_argument("--child-timeout", type=float, default=None,
                   help="seconds a model's subprocess may take before it is stopped and its row records a timeout "
                        "(default: no limit); for a run with a fixed time budget")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode: one model, JSON row out
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.test_images < 1 or args.test_rounds < 1:
        p.error("--test-images and --test-rounds must be at least 1")
    device = pick_device(args.device)
    if device.type == "cuda" and args.cuda_graphs != "off" and args.warmup <= GRAPH_WARMUP_STEPS:
        p.error(f"--warmup {args.warmup}: on CUDA the Trainer captures its step as a graph at step "
                f"{GRAPH_WARMUP_STEPS + 1} of every fit, and the capture must not be timed: use --warmup "
                f"{GRAPH_WARMUP_STEPS + 1} or more, or --cuda-graphs off")
    if args.one:
        print(json.dumps(measure_one(args.models[0], device, args.batch_size, args.steps, args.warmup, args.compile,
                                     not args.nondeterministic, args.precision, not args.no_channels_last,
                                     args.cuda_graphs, args.test_images, args.test_rounds)))
        return {}
    autocast = training_dtype(device, args.precision)
    rows = []
    for name in args.models:
        cmd = [sys.executable, __file__, "--one", "--device", str(device), "--models", name, "--batch-size",
               str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--precision", args.precision, "--cuda-graphs", args.cuda_graphs,
               "--test-images", str(args.test_images), "--test-rounds", str(args.test_rounds)]
        cmd += ["--compile"] if args.compile else []
        cmd += ["--nondeterministic"] if args.nondeterministic else []
        cmd += ["--no-channels-last"] if args.no_channels_last else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
        except subprocess.TimeoutExpired:
            rows.append({"model": name, "error": [f"no row within --child-timeout={args.child_timeout:g} s"]})
        else:
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
                     "compile": args.compile, "precision": args.precision,
                     "autocast": str(autocast).removeprefix("torch.") if autocast else "float32",
                     "amp_bf16": autocast == torch.bfloat16, "channels_last": not args.no_channels_last,
                     "cuda_graphs": args.cuda_graphs, "deterministic": not args.nondeterministic,
                     "epoch": f"{TRAIN_IMAGES} images, extrapolated from the timed steps",
                     "epoch_with_test": f"the epoch plus one test pass over {TEST_IMAGES} images (Trainer._end_epoch's "
                                        f"mean_loss_and_accuracy; {args.test_images} timed, one warm-up pass, median "
                                        f"of {args.test_rounds})"},
        "models": rows,
    }
    wrn = next((r for r in rows if r["model"] == "wrn28_10" and "epoch_seconds_50k" in r), None)
    if device.type == "cuda" and wrn is not None:
        payload["target_wrn28_10_epoch"] = {"seconds_at_most": WRN_EPOCH_TARGET_S, "seconds": wrn["epoch_seconds_50k"],
                                            "pass": wrn["epoch_seconds_50k"] <= WRN_EPOCH_TARGET_S,
                                            "scope": "training steps only (epoch_seconds_50k)",
                                            "seconds_with_test": wrn["epoch_with_test_seconds"]}
    write_result("_".join(part for part in ("models", variant_name(args)) if part), device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
