"""Where a training step's time goes: ``Trainer.fit`` under each setting that changes the step's kernels.

Why: on an H100 the trainer's default step (bf16 autocast, channels_last, ``run.deterministic``) trained
PreResNet-164 at 0.75x the fp32 reference loop of ``throughput.py`` while WRN-28-10 ran 2.1x faster. A deep,
thin network at batch 128 launches thousands of small kernels a step, so the settings that add kernels
(autocast's casts, layout conversions) or pick slower ones (deterministic cuDNN algorithms, no autotuning) can
cost more than they save. This benchmark times each combination of

* ``precision``: ``fp32`` or ``auto`` (bf16 autocast on CUDA, fp32 on CPU),
* ``channels_last``: the trainer's layout or the default NCHW,
* ``deterministic``: ``run.deterministic`` (deterministic algorithms, no cuDNN autotuning) or not,

through ``swalab.trainer.Trainer.fit`` on random pixels (timings do not depend on pixel values), rounds
interleaved (every variant once per round), medians reported; with ``--compile`` also the default variant
under ``torch.compile``. ``--batch-sizes`` repeats the default variant at other batch sizes: images/s that
grow with the batch mean the step is bound by launching kernels, not by the GPU's arithmetic.

    python bench/step_variants.py --device cuda --model preresnet164 --rounds 3
    python bench/step_variants.py --device cpu --model preresnet20 --images 1024 --batch-size 64 --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from _common import TrainerBench, build_model, machine_info, median, pick_device, random_split, write_result


def variant_name(precision: str, channels_last: bool, deterministic: bool, batch_size: int, compile: bool) -> str:
    return (f"{precision}-{'channels_last' if channels_last else 'nchw'}-"
            f"{'deterministic' if deterministic else 'autotuned'}-b{batch_size}{'-compiled' if compile else ''}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--model", default="preresnet164", help="a conf/model name")
    p.add_argument("--images", type=int, default=6400, help="random training images per timed epoch")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[], help="more batch sizes for the default variant")
    p.add_argument("--warmup", type=int, default=5, help="steps per epoch not timed")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--compile", action="store_true", help="also the default variant under torch.compile")
    p.add_argument("--out", default=None, help="result file (default bench/results/step_variants_<model>_<device>.json)")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    torch.manual_seed(0)

    # (precision, channels_last, deterministic, batch size, compile); the trainer's default first.
    variants = [(prec, cl, det, args.batch_size, False)
                for prec, cl, det in itertools.product(("auto", "fp32"), (True, False), (True, False))]
    variants += [("auto", True, True, b, False) for b in args.batch_sizes if b != args.batch_size]
    if args.compile:
        variants.append(("auto", True, True, args.batch_size, True))
    split = random_split(args.images)
    benches = {}
    for prec, cl, det, b, comp in variants:
        benches[variant_name(prec, cl, det, b, comp)] = TrainerBench(
            build_model(args.model), split, b, device, args.warmup, precision=prec, channels_last=cl,
            compile=comp, deterministic=det)
    rows = []
    for r in range(args.rounds):
        row = {"round": r}
        for name, bench in benches.items():
            row[name] = bench.run()
            print(f"round {r}: {name} {row[name]:.1f} img/s", file=sys.stderr)
        rows.append(row)
    images_per_s = {name: median([row[name] for row in rows]) for name in benches}
    default = variant_name("auto", True, True, args.batch_size, False)
    payload = {
        "benchmark": "step_variants",
        "command": "python bench/step_variants.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"model": args.model, "images": args.images, "batch_size": args.batch_size,
                     "warmup_steps": args.warmup, "rounds": args.rounds, "data": "random pixels",
                     "default_variant": default,
                     "note": "auto = bf16 autocast on CUDA (fp32 on CPU); autotuned = run.deterministic=false"},
        "rounds": rows,
        "images_per_s": images_per_s,
        "relative_to_default": {name: ips / images_per_s[default] for name, ips in images_per_s.items()},
        "fastest": max(images_per_s, key=images_per_s.get),
    }
    write_result(f"step_variants_{args.model}", device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
