"""Test-pass time against the evaluation batch size (what ``run.eval_batch_size: null`` picks per device).

The scoring passes (``swalab.evaluate.predict_logits``: eval mode, no grad, channels_last as the trainer runs
them) over the same images at several batch sizes, interleaved rounds, medians, reported as seconds per
10,000 images. On a CPU large batches are slower (their activations fall out of the caches), on a GPU they
fill the device; the result chose the defaults in ``swalab.train.build.eval_batch_size``.

Usage::

    python bench/eval_batch.py --device cpu --model preresnet20 --images 2000 --batch-sizes 128 256 500 1000 --rounds 3
    python bench/eval_batch.py --device cuda --model wrn28_10 --images 10000 --batch-sizes 128 500 1000 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import (CIFAR_MEAN, CIFAR_STD, build_model, machine_info, median, pick_device,  # noqa: E402
                     random_split, timed, write_result)

from swalab.data import ResidentLoader  # noqa: E402
from swalab.evaluate import predict_logits  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="preresnet20")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 256, 500, 1000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = pick_device(args.device)
    model = build_model(args.model).to(device).to(memory_format=torch.channels_last).eval()
    split = random_split(args.images)
    loaders = {bs: ResidentLoader(split, bs, device=device, mean=CIFAR_MEAN, std=CIFAR_STD, train=False,
                                  channels_last=True) for bs in args.batch_sizes}
    predict_logits(model, loaders[args.batch_sizes[0]], device)  # warm up
    rows = [{bs: timed(lambda: predict_logits(model, loader, device), device)
             for bs, loader in loaders.items()} for _ in range(args.rounds)]
    per_10k = {bs: median([r[bs] for r in rows]) * 10000 / args.images for bs in args.batch_sizes}
    payload = {
        "benchmark": "eval_batch",
        "command": "python bench/eval_batch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"model": args.model, "images": args.images, "rounds": args.rounds, "channels_last": True},
        "rounds": [{str(bs): s for bs, s in r.items()} for r in rows],
        "seconds_per_10k_images": {str(bs): s for bs, s in per_10k.items()},
        "fastest_batch_size": min(per_10k, key=per_10k.get),
    }
    write_result(f"eval_batch_{args.model}", device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
