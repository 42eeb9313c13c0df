"""What the data fingerprint adds to a run's start: ``folder_record`` over an image folder, first and cached.

    python bench/data_fingerprint.py [--root ../shared/data/cifar10-jpg] [--rounds 3]

A run computes the record of the files it reads before anything else (``swalab.data.fingerprint``): the
first time each file's first and last 32 KiB are hashed (the whole file for CIFAR's ~1.5 KB JPEGs), later
only its ``stat`` is compared with the cached key. Each round here starts with an empty digest cache
(``first``) and then reads the folder again with the cache it just wrote (``cached``); the listing alone
(``list_image_folder``, which the loader does anyway) is timed beside them. The files themselves may sit in
the page cache after the first round: ``first`` then measures hashing, not the disk.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from _common import DEFAULT_DATA, machine_info, median, write_result
from swalab.data.fingerprint import folder_record
from swalab.data.folder import IMAGE_EXTENSIONS, SPLITS, list_image_folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=DEFAULT_DATA, help="an image folder (train/<class>/*, test/<class>/*)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        _, files = list_image_folder(args.root)
        listing = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            first = folder_record(args.root, SPLITS, IMAGE_EXTENSIONS, cache)
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = folder_record(args.root, SPLITS, IMAGE_EXTENSIONS, cache)
            warm = time.perf_counter() - t0
        assert again == first
        rows.append({"listing_s": listing, "first_s": cold, "cached_s": warm})
    n = sum(len(v) for v in files.values())
    payload = {"benchmark": "data_fingerprint", "machine": machine_info(torch.device("cpu")), "root": args.root, "files": n, "rounds": rows,
               "median_listing_s": median([r["listing_s"] for r in rows]),
               "median_first_s": median([r["first_s"] for r in rows]),
               "median_cached_s": median([r["cached_s"] for r in rows]),
               "fingerprint": first["fingerprint"]}
    write_result("data_fingerprint", torch.device("cpu"), payload, args.out)


if __name__ == "__main__":
    main()
