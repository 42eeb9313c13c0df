"""A test pass and a BN update on 2 CPU ranks, sharded (each rank 1/2 of the batches) against unsharded
(every rank all of them, as before ``swalab.distributed`` sharded scoring).

Two processes join a gloo process group, one torch thread each (2 ranks on 2 cores). Each round runs, in
turn, the sharded and the unsharded test pass (``swalab.evaluate.predict_logits``) and BN update
(``swalab.evaluate.recompute_bn``) on the same network and images; a pass's time is the slowest rank's,
between two barriers. Unsharded is the single-process code path on every rank (``swalab.distributed.info``
reporting one process), which is what every rank ran before. Also reported: whether the sharded results equal
the unsharded ones (logits bit for bit, BN statistics up to float summation order).

Usage::

    python bench/sharded_eval.py --model preresnet20 --test-images 2000 --bn-images 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _common import (CIFAR_MEAN, CIFAR_STD, build_model, machine_info, median, random_split,  # noqa: E402
                     write_result)

from swalab import distributed  # noqa: E402
from swalab.data import ResidentLoader  # noqa: E402
from swalab.evaluate import predict_logits, recompute_bn  # noqa: E402

CPU = torch.device("cpu")


@contextlib.contextmanager
def unsharded():
    """Inside: every rank scores and re-estimates BN over all the batches alone (the one-process path)."""
    real = distributed.info
    distributed.info = lambda: distributed.DistInfo()
    try:
        yield
    finally:
        distributed.info = real


def slowest_rank(fn) -> float:
    """Seconds of ``fn()`` on the slowest rank, all ranks starting together."""
    dist.barrier()
    t = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def bn_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = build_model(args.model).to(memory_format=torch.channels_last)
        common = dict(device=CPU, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=True)
        test = ResidentLoader(random_split(args.test_images, seed=1), args.batch_size, train=False, **common)
        bn = ResidentLoader(random_split(args.bn_images, seed=2), args.batch_size, train=True, drop_last=False,
                            **common)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        rounds = []
        results = {}
        for _ in range(args.rounds):
            row = {}
            for mode in ("sharded", "unsharded"):
                scope = unsharded() if mode == "unsharded" else contextlib.nullcontext()
                model.load_state_dict(start)  # both modes score the same network
                with scope:
                    row[f"test_pass_{mode}"] = slowest_rank(lambda: results.__setitem__(
                        f"logits_{mode}", predict_logits(model, test, CPU)))
                    row[f"bn_update_{mode}"] = slowest_rank(lambda: recompute_bn(model, bn, CPU))
                    results[f"bn_{mode}"] = bn_state(model)
            rounds.append(row)
        if rank == 0:
            same_logits = torch.equal(results["logits_sharded"], results["logits_unsharded"])
            bn_diff = max(float((results["bn_sharded"][k] - results["bn_unsharded"][k]).abs().max())
                          for k in results["bn_sharded"])
            torch.save({"rounds": rounds, "same_logits": same_logits, "bn_max_abs_diff": bn_diff}, out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="preresnet20")
    p.add_argument("--test-images", type=int, default=2000)
    p.add_argument("--bn-images", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="swalab-bench-") as tmp:
        out = str(Path(tmp) / "rank0.pt")
        mp.start_processes(_worker, args=(args.ranks, free_port(), args, out), nprocs=args.ranks, start_method="spawn")
        found = torch.load(out, weights_only=False)
    rounds = found["rounds"]
    med = {key: median([r[key] for r in rounds]) for key in rounds[0]}
    payload = {
        "benchmark": "sharded_eval",
        "command": "python bench/sharded_eval.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {**machine_info(CPU), "torch_threads": 1, "ranks": args.ranks, "backend": "gloo"},
        "settings": {"model": args.model, "test_images": args.test_images, "bn_images": args.bn_images,
                     "batch_size": args.batch_size, "rounds": args.rounds},
        "rounds": rounds,
        "median_seconds": med,
        "speedup": {"test_pass": med["test_pass_unsharded"] / med["test_pass_sharded"],
                    "bn_update": med["bn_update_unsharded"] / med["bn_update_sharded"]},
        "sharded_equals_unsharded": {"logits_bit_equal": found["same_logits"],
                                     "bn_statistics_max_abs_diff": found["bn_max_abs_diff"]},
    }
    write_result(f"sharded_eval_{args.model}_{args.ranks}ranks", CPU, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
