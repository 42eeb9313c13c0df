"""The training step on a GPU, eager against CUDA-graphed, per precision, beside the 2018-style reference loop.

Why: issue 39's targets are about what a researcher waits for on a GPU. For each model this times, in rounds
interleaved in one process (medians reported):

* ``Trainer.fit`` steps (``bench/_common.TrainerBench``: random pixels, warm-up steps untimed) under
  ``run.deterministic`` for every combination of ``run.cuda_graphs`` (``off``, ``on``) and precision/layout
  (``bf16`` with channels_last, ``fp32`` with channels_last, ``fp32`` NCHW);
* the reference: the plain loop the paper's code runs, on the same batches already in memory (so the ratio is
  the model step's alone): fp32, NCHW, ``torch.optim.SGD`` as torch builds it, ``loss.item()`` every step, and
  ``torch.backends.cudnn.benchmark = True`` as the original training script sets (the reference at its best);
* with ``--compile``: the trainer's default variant (bf16, channels_last) under ``run.compile``, to measure what
  fused BN/ReLU kernels give the wide, compute-bound WRN-28-10 (issue 39's open 3x target), three ways
  (:data:`COMPILED`): torch.compile's default mode with the step run eagerly, the same step captured as swalab's
  CUDA graph, and ``mode="reduce-overhead"`` (compile's own graphs); each compile time is reported, not timed in;
* one test pass over ``--test-images`` images at the evaluation batch size (``mean_loss_and_accuracy``, what each
  epoch's history row scores), so that an epoch reads as a user waits for it: 50,000 training images plus a
  10,000-image test pass (``epoch_with_test_seconds``);
* with ``--full-epochs N``: ``Trainer.fit`` itself over N real-length epochs of 50,000 random images with the
  per-epoch test pass and a checkpoint every epoch (the default run settings), its history's seconds and the
  wall time of the whole fit.

``precision_auto`` names the fastest graphed deterministic variant's precision: the choice ``trainer.precision=auto``
is measured by. Each model writes ``bench/results/gpu_step_<model>_<device>.json`` when it finishes.

    python bench/gpu_step.py --device cuda --models vgg16 preresnet164 wrn28_10 --rounds 3
    python bench/gpu_step.py --device cpu --models preresnet20 --images 256 --batch-size 32 --rounds 1 --test-images 64
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

from _common import (CIFAR_MEAN, CIFAR_STD, TrainerBench, build_model, machine_info, median, paper_sgd_trainer,
                     pick_device, random_split, sync, timed, write_result)

from swalab.data import ResidentLoader
from swalab.evaluate import labels_of, mean_loss_and_accuracy
from swalab.methods.sgd import SGD
from swalab.schedules import Constant

TRAIN_IMAGES, TEST_IMAGES = 50_000, 10_000
# (precision, channels_last) pairs timed under each run.cuda_graphs value; the trainer's CUDA default first.
PRECISIONS = (("bf16", True), ("fp32", True), ("fp32", False))
# --compile: run.compile and run.cuda_graphs per variant, at the default precision and layout
COMPILED = {"compiled-bf16-channels_last": ("default", "off"),
            "compiled-graphs_on-bf16-channels_last": ("default", "on"),
            "compiled-reduce_overhead-bf16-channels_last": ("reduce-overhead", "auto")}
# --autotune: kernels chosen by timing them, under swalab's graph: inductor's (Triton templates for the GEMMs), and
# cuDNN's (run.deterministic=false: cudnn.benchmark, what the reference has; a run is then not bit-repeatable)
AUTOTUNED = {"compiled_autotune-graphs_on-bf16-channels_last": ("max-autotune-no-cudagraphs", "on", True),
             "compiled-graphs_on-bf16-channels_last-nondeterministic": ("default", "on", False)}


def compiled_variants(args) -> dict[str, tuple[str, str, bool]]:
    """The compiled variants this call times, each (run.compile, run.cuda_graphs, run.deterministic): none without
    ``--compile``; ``AUTOTUNED`` too with ``--autotune``."""
    compiled = {name: (mode, graphs, True) for name, (mode, graphs) in COMPILED.items()}
    return {**compiled, **(AUTOTUNED if args.autotune else {})} if args.compile else {}


def variant(graphs: str, precision: str, channels_last: bool) -> str:
    return f"graphs_{graphs}-{precision}-{'channels_last' if channels_last else 'nchw'}"


@contextlib.contextmanager
def reference_cudnn():
    """cuDNN as the reference's script leaves it: autotuned, not restricted to deterministic algorithms."""
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled())
    cudnn.benchmark, cudnn.deterministic = True, False
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = before[0], before[1]
        torch.use_deterministic_algorithms(before[2], warn_only=True)


class ReferenceLoop:
    """The 2018-style loop on batches in memory: fp32, NCHW, plain SGD (momentum 0.9, wd 5e-4), ``loss.item()``
    each step; timed over the steps after ``warmup``."""

    def __init__(self, model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device, warmup: int):
        self.model, self.batches, self.device, self.warmup = model.to(device), batches, device, warmup
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def run(self) -> float:
        self.model.train()
        with reference_cudnn():
            t0 = None
            for i, (x, y) in enumerate(self.batches):
                if i == self.warmup:
                    sync(self.device)
                    t0 = time.perf_counter()
                loss = F.cross_entropy(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                loss.item()
            sync(self.device)
        images = sum(len(y) for _, y in self.batches[self.warmup:])
        return images / (time.perf_counter() - t0)


def test_pass_seconds(model: torch.nn.Module, images: int, batch_size: int, device, channels_last: bool,
                      repeats: int = 3) -> float:
    """Median seconds of the per-epoch test pass over ``images`` random images, after one untimed pass."""
    split = random_split(images, seed=1)
    loader = ResidentLoader(split, batch_size, train=False, device=device, mean=CIFAR_MEAN, std=CIFAR_STD,
                            channels_last=channels_last)
    labels = labels_of(loader)
    mean_loss_and_accuracy(model, loader, device, labels=labels)
    return median([timed(lambda: mean_loss_and_accuracy(model, loader, device, labels=labels), device)
                   for _ in range(repeats)])


def full_epochs(name: str, device, batch_size: int, epochs: int, test_images: int, graphs: str) -> dict:
    """``Trainer.fit`` over ``epochs`` epochs of 50,000 random images, test pass and checkpoint each epoch."""
    torch.manual_seed(0)
    common = dict(device=device, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=True)
    train = ResidentLoader(random_split(TRAIN_IMAGES), batch_size, train=True, pad=4, flip=True, seed=0, **common)
    test_split = random_split(test_images, seed=1)
    test = ResidentLoader(test_split, 1000 if device.type == "cuda" else 128, train=False, **common)
    with tempfile.TemporaryDirectory(prefix="swalab-bench-") as tmp:
        trainer = paper_sgd_trainer(build_model(name), SGD(Constant(lr=0.05), epochs), train, test, train, device, tmp,
                                    weight_decay=5e-4, epochs=epochs, progress=False, handle_signals=False,
                                    cuda_graphs=graphs)
        sync(device)
        t0 = time.perf_counter()
        trainer.fit()
        sync(device)
        wall = time.perf_counter() - t0
        seconds = [row["seconds"] for row in trainer.history]
    return {"cuda_graphs": graphs, "epochs": epochs, "history_seconds": seconds, "fit_wall_seconds": wall,
            "note": "history seconds: the epoch's steps and its test pass; the wall time adds the checkpoints and "
                    "the final scoring"}


def measure_model(name: str, device, args) -> dict:
    torch.manual_seed(0)
    split = random_split(args.images)
    benches = {}
    for graphs in ("off", "on") if device.type == "cuda" else ("off",):
        for precision, channels_last in PRECISIONS:
            benches[variant(graphs, precision, channels_last)] = TrainerBench(
                build_model(name), split, args.batch_size, device, args.warmup, precision=precision,
                channels_last=channels_last, deterministic=True, cuda_graphs=graphs)
    compile_seconds = {}
    for vname, (mode, graphs, deterministic) in compiled_variants(args).items():
        t0 = time.perf_counter()
        benches[vname] = TrainerBench(build_model(name), split, args.batch_size, device, args.warmup,
                                      precision="bf16", channels_last=True, deterministic=deterministic, compile=mode,
                                      cuda_graphs=graphs if device.type == "cuda" else "off")
        benches[vname].run()  # the first epoch compiles (forward and backward); its time is the compile cost
        compile_seconds[vname] = time.perf_counter() - t0
    common = dict(device=device, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=False)
    batches = list(ResidentLoader(split, args.batch_size, train=True, drop_last=True, **common))
    reference = ReferenceLoop(build_model(name), batches, device, args.warmup)
    rows = []
    for r in range(args.rounds):
        row = {"round": r, "reference": reference.run()}
        for vname, bench in benches.items():
            row[vname] = bench.run()
        print(f"[gpu_step] {name} round {r}: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items() if k != "round"),
              file=sys.stderr, flush=True)
        rows.append(row)
    images_per_s = {k: median([row[k] for row in rows]) for k in rows[0] if k != "round"}
    on = "on" if device.type == "cuda" else "off"  # a CPU run (a check of this script) has no graphed variant
    graphed = {v: images_per_s[v] for v in images_per_s if v.startswith(f"graphs_{on}")}
    default = variant(on, "bf16", True)
    fastest_graphed = max(graphed, key=graphed.get)
    eval_batch = 1000 if device.type == "cuda" else 128
    model = benches[default].trainer.model
    test_seconds = test_pass_seconds(model, args.test_images, eval_batch, device, channels_last=True)
    test_seconds_10k = test_seconds * TEST_IMAGES / args.test_images

    def epoch(v: str) -> dict:
        train_s = TRAIN_IMAGES / images_per_s[v]
        return {"train_seconds_50k": train_s, "epoch_with_test_seconds": train_s + test_seconds_10k}

    payload = {
        "benchmark": "gpu_step",
        "machine": machine_info(device),
        "settings": {"model": name, "images": args.images, "batch_size": args.batch_size, "warmup_steps": args.warmup,
                     "rounds": args.rounds, "data": "random pixels", "deterministic": True,
                     "test_images": args.test_images, "eval_batch_size": eval_batch,
                     "reference": "fp32 NCHW, torch.optim.SGD defaults, loss.item() per step, cudnn.benchmark=True, "
                                  "batches in memory"},
        "rounds": rows,
        "images_per_s": images_per_s,
        "relative_to_reference": {k: v / images_per_s["reference"] for k, v in images_per_s.items()},
        "graphs_speedup": {f"{p}-{'channels_last' if cl else 'nchw'}":
                           images_per_s[variant(on, p, cl)] / images_per_s[variant("off", p, cl)]
                           for p, cl in PRECISIONS},
        "default_variant": default,
        "fastest_graphed_variant": fastest_graphed,
        "precision_auto": fastest_graphed.split("-")[1],
        "test_pass_seconds_10k": test_seconds_10k,
        **({"compiled_vs_default": {v: images_per_s[v] / images_per_s[default] for v in compile_seconds},
            "compile_seconds": compile_seconds} if args.compile else {}),
        "epochs": {v: epoch(v) for v in images_per_s if v != "reference"},
    }
    if args.full_epochs:
        payload["full_epochs"] = full_epochs(name, device, args.batch_size, args.full_epochs, args.test_images,
                                             "on" if device.type == "cuda" else "off")
    return payload


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--models", nargs="+", default=["vgg16", "preresnet164", "wrn28_10"], help="conf/model names")
    p.add_argument("--images", type=int, default=3840, help="random training images per timed epoch")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5, help="steps per epoch not timed (the graph is captured at the 4th)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--test-images", type=int, default=TEST_IMAGES)
    p.add_argument("--compile", action="store_true", help="also time the default variant under run.compile (three ways: COMPILED)")
    p.add_argument("--autotune", action="store_true", help="with --compile, also the graphed compiled step with kernels "
                   "chosen by timing (AUTOTUNED: max-autotune-no-cudagraphs; run.deterministic=false); minutes of compiling")
    p.add_argument("--full-epochs", type=int, default=0, help="also Trainer.fit over N real-length epochs")
    p.add_argument("--out-dir", default=None, help="folder for the results (default bench/results)")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    results = {}
    for name in args.models:
        try:
            payload = measure_model(name, device, args)
        except Exception:  # noqa: BLE001  one model's failure is reported and the others still run
            traceback.print_exc()
            results[name] = {"error": traceback.format_exc(limit=3)}
            continue
        out = f"{args.out_dir}/gpu_step_{name}_{device.type}.json" if args.out_dir else None
        write_result(f"gpu_step_{name}", device, payload, out)
        results[name] = payload
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return results


if __name__ == "__main__":
    main()
