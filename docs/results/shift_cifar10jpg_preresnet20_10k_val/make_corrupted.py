"""Make the 75 CIFAR-10-C-style sets of the CIFAR-10 test split ahead of scoring, in parallel processes.

    python docs/results/shift_cifar10jpg_preresnet20_10k_val/make_corrupted.py <cifar-10 root> [--workers N]

When and why: ``python -m swalab.results.score --data cifar10c:all`` makes each corrupted set on first use, one image
after another in its own process (about 83 ms of one core per image for the five severities of all 15), and caches it
(``swalab.data.corruptions.corrupted_split``). On a lent GPU machine the scoring processes would wait on that; made here
first, on every core, they read the cache. The sets are the same ones score makes (same test split, seed and cache).
"""

import argparse
import time
from multiprocessing import Pool

from swalab.data import corruptions
from swalab.data.cifar import load_cifar

_test = None


def _make(job):
    corruption, severity = job
    start = time.time()
    corruptions.corrupted_split(_test, corruption, severity)
    return corruption, severity, time.time() - start


def main() -> None:
    global _test
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="the CIFAR-10 folder (dataset.root)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--corruptions", nargs="+", default=list(corruptions.MADE), help="default: all 15")
    parser.add_argument("--severities", type=int, nargs="+", default=list(corruptions.SEVERITIES))
    args = parser.parse_args()
    _test = load_cifar("cifar10", args.root, download=False).test  # read before the workers fork: shared
    slowest = ("zoom_blur", "fog", "frost", "snow")  # started first, so no worker is left with one at the end
    jobs = sorted(((c, s) for c in args.corruptions for s in args.severities),
                  key=lambda job: (job[0] not in slowest, -job[1]))
    with Pool(args.workers) as pool:
        for corruption, severity, seconds in pool.imap_unordered(_make, jobs):
            print(f"{corruption}-{severity}: {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
