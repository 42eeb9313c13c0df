"""What SWAG costs beside SWA: its test-time sampling against SWA's single pass, and the memory of its moments.

At the end of a run SWA scores one model: one BN update over the training data, then a pass over the test set and
(with ``dataset.val_size``) the validation split. SWAG scores ``method.samples`` (S = 30) draws for ``swag`` and as
many for ``swag_diag``, and each draw costs the same passes plus the draw itself (``SWAG.sample`` + loading the
weights): about 2 S times SWA's pass. This benchmark times, through the real code (``Trainer.update_bn``,
``Trainer.test_log_probs``, ``SWAG.sampled_log_probs``), in one process and interleaved (SWA pass, SWAG draw, SWAG-diag
draw, again), on real CIFAR-10 images when ``../shared/data/cifar10-jpg`` is there:

* one SWA pass (BN update, test pass, validation pass) and one SWAG sample of each kind, at the measured sizes;
* each part per image, and both totals extrapolated linearly to the evidence row of docs/uncertainty.md (BN update
  over 10,000 training images, 10,000 test and 5,000 validation images, S = 30 for each of swag and swag_diag).

The memory of the moments is computed from the parameter counts of ``conf/model/<name>.yaml``: the SWA mean, the mean
of squares and K = ``method.rank`` deviations, each a float32 vector of the parameters' size ((K + 2) x d x 4 bytes),
plus the three vectors a draw makes (variance, noise, draw). They live on ``method.moments_device`` (CPU by default).

Usage::

    python bench/swag_cost.py --device cpu --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (CIFAR_MEAN, CIFAR_STD, DEFAULT_DATA, build_model, load_split, machine_info, median,  # noqa: E402
                     pick_device, timed, write_result)

from swalab.data import DataSplit, ResidentLoader  # noqa: E402
from swalab.methods import SWAG  # noqa: E402
from swalab.methods.swag import flat_parameters, load_flat  # noqa: E402
from swalab.schedules import Constant  # noqa: E402
from swalab.trainer import Trainer, TrainerOptions  # noqa: E402

EVIDENCE = {"bn_images": 10_000, "test_images": 10_000, "val_images": 5_000, "samples": 30}
MEMORY_MODELS = ("preresnet20", "wrn28_10")


def moments_memory(name: str, rank: int) -> dict:
    """Bytes of SWAG's moments for ``conf/model/<name>.yaml`` (CIFAR-10 head), from its parameter count."""
    params = sum(p.numel() for p in build_model(name, num_classes=10).parameters())
    vector = params * 4  # float32
    return {"parameters": params, "rank": rank, "moments_bytes": (rank + 2) * vector,
            "moments_gib": (rank + 2) * vector / 2**30, "deviations_bytes": rank * vector,
            "draw_transient_bytes": 3 * vector, "weights_bytes": vector}


def filled_swag(model: torch.nn.Module, rank: int, samples: int, device: torch.device) -> SWAG:
    """A SWAG whose moments hold ``rank + 1`` captures of ``model`` with small perturbations (the sampling costs the
    same whatever the moments hold)."""
    method = SWAG(Constant(lr=0.05), 2, lr=0.05, start_epoch=0, rank=rank, samples=samples)
    method.on_train_start(SimpleNamespace(model=model))
    live = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    base = flat_parameters(model, "cpu")
    for _ in range(rank + 1):
        load_flat(live, base + 0.01 * torch.randn(base.shape, generator=generator))
        method.capture(SimpleNamespace(model=live, device=device))
    return method


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="preresnet20")
    p.add_argument("--data", default=DEFAULT_DATA, help="CIFAR-10 image folder (random pixels when absent)")
    p.add_argument("--bn-images", type=int, default=2000, help="training images of the timed BN update")
    p.add_argument("--test-images", type=int, default=2000)
    p.add_argument("--val-images", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128, help="the BN update's batch (the training batch)")
    p.add_argument("--rank", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = pick_device(args.device)
    train, train_source = load_split(args.data, args.bn_images, "train")
    test, test_source = load_split(args.data, args.test_images + args.val_images, "test")
    val = DataSplit(test.images[args.test_images:], test.labels[args.test_images:])  # images apart from the test's
    test = DataSplit(test.images[:args.test_images], test.labels[:args.test_images])
    common = dict(device=device, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=True)
    eval_batch = 1000 if device.type == "cuda" else 128  # swalab.train.build.eval_batch_size's defaults
    model = build_model(args.model).to(device).to(memory_format=torch.channels_last)
    method = filled_swag(model, args.rank, samples=1, device=device)
    with tempfile.TemporaryDirectory(prefix="swalab-bench-") as tmp:
        trainer = Trainer(model, method, ResidentLoader(train, args.batch_size, train=True, **common),
                          ResidentLoader(test, eval_batch, train=False, **common),
                          ResidentLoader(train, args.batch_size, train=True, drop_last=False, seed=1, **common),
                          device, tmp, TrainerOptions(epochs=1, progress=False, handle_signals=False),
                          val_loader=ResidentLoader(val, eval_batch, train=False, **common))
        ctx = trainer.ctx
        swa_model = method.averaged.module
        mean = flat_parameters(swa_model, "cpu")
        generator = torch.Generator().manual_seed(1)
        times: dict[str, list[float]] = {k: [] for k in ("bn_update", "test_pass", "val_pass", "draw_low_rank",
                                                         "draw_diag", "swag_sample", "swag_diag_sample")}
        trainer.update_bn(swa_model)  # warm-up: allocator, oneDNN kernels
        for _ in range(args.rounds):
            times["bn_update"].append(timed(lambda: trainer.update_bn(swa_model), device))
            times["test_pass"].append(timed(lambda: ctx.test_log_probs(swa_model), device))
            times["val_pass"].append(timed(lambda: ctx.val_log_probs(swa_model), device))
            target = copy.deepcopy(swa_model)
            times["draw_low_rank"].append(timed(lambda: load_flat(target, method.sample(mean, generator, True)), device))
            times["draw_diag"].append(timed(lambda: load_flat(target, method.sample(mean, generator, False)), device))
            times["swag_sample"].append(timed(lambda: method.sampled_log_probs(ctx, True, generator), device))
            times["swag_diag_sample"].append(timed(lambda: method.sampled_log_probs(ctx, False, generator), device))
    med = {k: median(v) for k, v in times.items()}
    measured = {"bn_images": len(train), "test_images": len(test), "val_images": len(val)}
    per_image = {"bn_update": med["bn_update"] / len(train), "test_pass": med["test_pass"] / len(test),
                 "val_pass": med["val_pass"] / len(val)}
    swa_measured = med["bn_update"] + med["test_pass"] + med["val_pass"]
    passes = (per_image["bn_update"] * EVIDENCE["bn_images"] + per_image["test_pass"] * EVIDENCE["test_images"]
              + per_image["val_pass"] * EVIDENCE["val_images"])
    swag_evidence = EVIDENCE["samples"] * (2 * passes + med["draw_low_rank"] + med["draw_diag"])
    payload = {
        "benchmark": "swag_cost", "model": args.model, "rounds": args.rounds, "rank": args.rank,
        "data": {"train": train_source, "test_and_val": test_source}, "measured_sizes": measured,
        "median_seconds": med,
        "swa_pass_seconds_measured": swa_measured,
        "one_sample_over_swa_pass": {"swag": med["swag_sample"] / swa_measured,
                                     "swag_diag": med["swag_diag_sample"] / swa_measured},
        "sample_equals_passes_plus_draw": {  # the sampled_log_probs timing against the sum of its parts
            "swag": med["swag_sample"] / (swa_measured + med["draw_low_rank"]),
            "swag_diag": med["swag_diag_sample"] / (swa_measured + med["draw_diag"])},
        "seconds_per_image": per_image,
        "evidence_row": {**EVIDENCE, "swa_pass_seconds": passes, "swag_and_swag_diag_seconds": swag_evidence,
                         "swag_over_swa": swag_evidence / passes},
        "moments_memory": {name: moments_memory(name, args.rank) for name in MEMORY_MODELS},
        "machine": machine_info(device),
    }
    path = write_result(f"swag_cost_{args.model}", device, payload, args.out)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return payload


if __name__ == "__main__":
    main()
