"""ResidentLoader epoch time: normalising every batch versus normalising the split once (``prenormalize``).

Both loaders yield bit-identical batches (tests/test_speed_invariants.py); this measures what the
once-per-run normalisation saves per epoch. Interleaved rounds, medians.

Usage::

    python bench/loader.py --device cpu --images 10000 --batch-size 512 --rounds 5
    python bench/loader.py --device cuda --images 50000 --batch-size 512 --rounds 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CIFAR_MEAN, CIFAR_STD, machine_info, median, pick_device, random_split, timed, write_result  # noqa: E402

from swalab.data import ResidentLoader  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = pick_device(args.device)
    split = random_split(args.images)
    kw = dict(batch_size=args.batch_size, device=device, mean=CIFAR_MEAN, std=CIFAR_STD, train=True,
              channels_last=True)
    loaders = {"per_batch": ResidentLoader(split, prenormalize=False, **kw),
               "prenormalized": ResidentLoader(split, prenormalize=True, **kw)}
    rows = []
    for r in range(args.rounds):
        rows.append({name: timed(lambda: [x for x, _ in loader], device) for name, loader in loaders.items()})
    per_batch, pre = median([r["per_batch"] for r in rows]), median([r["prenormalized"] for r in rows])
    payload = {
        "benchmark": "loader",
        "command": "python bench/loader.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"images": args.images, "batch_size": args.batch_size, "rounds": args.rounds,
                     "channels_last": True},
        "rounds": rows,
        "epoch_seconds": {"per_batch": per_batch, "prenormalized": pre},
        "epoch_seconds_50k": {"per_batch": per_batch * 50000 / args.images, "prenormalized": pre * 50000 / args.images},
        "speedup": per_batch / pre,
        "default_on_this_device": "prenormalized" if device.type == "cuda" else "per_batch",
    }
    write_result("loader", device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
