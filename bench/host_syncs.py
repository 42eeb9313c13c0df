"""Host syncs per training step and per BN-update batch, and step times, of this tree against a baseline commit.

A host sync is a point where the Python thread must wait for the accelerator to finish its queue before it can
go on: on CUDA the loop then stops feeding the GPU until the device has caught up. No GPU is needed to count
them, because every sync torch can cause in a training loop is an operator the profiler records on the CPU too:

* ``aten::_local_scalar_dense``: every read of one value into Python (``.item()``, ``float(t)``, ``int(t)``,
  ``bool(t)``, an ``if t:`` or ``if t == 0`` on a tensor), the way BatchNorm reads ``num_batches_tracked`` when
  its momentum is None, the way tqdm's postfix reads a loss;
* ``aten::nonzero`` (and ``aten::unique*``, ``aten::masked_select``): an output whose size depends on the
  values (a boolean mask index), which the host must know before it can go on.

Copies to the host (``.cpu()``, ``.tolist()``) are the one kind the CPU cannot show (they are no copy there);
the training step and the BN update of swalab make none. So the counts below are what a CUDA run of the same
code would sync, read off the CPU profiler (``torch.profiler``, CPU activity).

What is counted: ``Trainer.fit`` with progress left to its default (``run.progress=null``: a bar only on a
terminal; this script runs the fit with stderr on a pipe, as under SLURM or nohup), SGD and EMA (timm's decay,
``update_every=1``), on random CIFAR-shaped images; the profiler runs from the end of step ``warmup`` to the end
of the last step, so whole step cycles are counted (data, forward, backward, optimizer, the method's hook, the
loop's bookkeeping), divided by their number (a multiple of 10: the bar's postfix runs every 10 steps).
Per BN-update batch: ``Trainer.update_bn`` over ``--bn-batches`` batches, profiled whole, divided by them.
Also the number of ``aten::copy_`` calls made one tensor at a time (one launch each on a GPU), of multi-tensor
``aten::_foreach_*`` calls (one launch per chunk of tensors on a GPU; on the CPU they run one op per tensor, which
are not counted as copies), of all ops, per step and per batch, and the seconds per step and per BN batch (medians
of the unprofiled rounds). A CPU waits for nothing at a sync, so the seconds cannot show what removing syncs
saves on a GPU; they show what the change costs on the CPU.

The baseline is the same code at another commit (``--baseline``, default the merge base with ``main``): its
``src/`` is exported with ``git archive`` into a temporary folder and run by the same child code with that
folder first on ``PYTHONPATH``; the two sides run as alternating child processes (before, after, before, ...),
so load on the shared machine hits both alike.

Usage::

    python bench/host_syncs.py --models preresnet20 preresnet164 --rounds 3
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import ROOT, build_model, machine_info, median, paper_sgd_trainer, random_split, write_result  # noqa: E402

SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::unique", "aten::_unique", "aten::_unique2",
            "aten::unique_consecutive", "aten::masked_select")
COPY_OP = "aten::copy_"
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def _inside_foreach(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::_foreach"):
            return True
        parent = parent.cpu_parent
    return False


def counts(events) -> dict:
    """Sync ops, copies launched one tensor at a time, multi-tensor (``_foreach``) calls, and every op. On the CPU a
    ``_foreach`` op runs as one op per tensor beneath it (the CPU has no multi-tensor kernel); on CUDA it is one
    launch per chunk of tensors, so copies beneath a ``_foreach`` op are not counted as copies of their own."""
    names = [e.name for e in events]
    syncs = {op: names.count(op) for op in SYNC_OPS if names.count(op)}
    copies = sum(e.name == COPY_OP and not _inside_foreach(e) for e in events)
    foreach = sum(e.name.startswith("aten::_foreach") and not _inside_foreach(e) for e in events)
    return {"syncs": sum(syncs.values()), "sync_ops": syncs, "copies": copies, "foreach_calls": foreach,
            "ops": len(names)}


def child(model_name: str, method_name: str, batch_size: int, warmup: int, steps: int, bn_batches: int,
          profile: bool) -> dict:
    """One side, one model, one method: a profiled or a timed ``Trainer.fit`` and BN update (module doc)."""
    from swalab.data import ResidentLoader
    from swalab.methods import EMA, SGD
    from swalab.schedules import Constant

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    base = {"sgd": SGD, "ema": EMA}[method_name]
    marks: list[float] = []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None

    class Marked(base):  # the method's own hook first, then the mark: a step cycle ends here
        def on_step_end(self, ctx, epoch, step):
            super().on_step_end(ctx, epoch, step)
            marks.append(time.perf_counter())
            if profiler is not None and step + 1 == warmup:
                profiler.start()
            if profiler is not None and step + 1 == warmup + steps:
                profiler.stop()

    kwargs = {"decay": 0.999} if method_name == "ema" else {}
    method = Marked(Constant(lr=0.01), 1, **kwargs)
    train = random_split((warmup + steps) * batch_size)
    common = dict(device=cpu, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=True)
    loader = ResidentLoader(train, batch_size, train=True, drop_last=True, **common)
    bn = ResidentLoader(random_split(bn_batches * batch_size, seed=1), batch_size, train=True, drop_last=True, **common)
    test = ResidentLoader(random_split(batch_size, seed=2), batch_size, train=False, **common)
    with tempfile.TemporaryDirectory(prefix="swalab-bench-") as tmp:
        trainer = paper_sgd_trainer(build_model(model_name), method, loader, test, bn, cpu, tmp, weight_decay=5e-4,
                                    epochs=1, eval_every=0, checkpoint_every=10**6, progress=None, handle_signals=False)
        with contextlib.redirect_stderr(io.StringIO()):  # off a terminal, as under SLURM: tqdm's default bar is off
            trainer.fit()
        out = {"model": model_name, "method": method_name, "batch_size": batch_size}
        if profile:
            out["train_step"] = {k: v / steps if isinstance(v, int) else {o: n / steps for o, n in v.items()}
                                 for k, v in counts(profiler.events()).items()}
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as bn_prof:
                trainer.update_bn(trainer.model)
            out["bn_update_batch"] = {k: v / bn_batches if isinstance(v, int) else
                                      {o: n / bn_batches for o, n in v.items()}
                                      for k, v in counts(bn_prof.events()).items()}
        else:
            gaps = [b - a for a, b in zip(marks[warmup - 1:], marks[warmup:])]
            out["step_seconds"] = median(gaps)
            t = time.perf_counter()
            trainer.update_bn(trainer.model)
            out["bn_batch_seconds"] = (time.perf_counter() - t) / bn_batches
    return out


def export(commit: str) -> Path:
    """``src/`` of ``commit``, unpacked into a temporary folder (no checkout, no change to the repository)."""
    folder = Path(tempfile.mkdtemp(prefix=f"swalab-{commit[:8]}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def run_child(src: Path, args, model: str, method: str, batch_size: int, profile: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, "--child", model, method, str(batch_size), str(args.warmup), str(args.steps),
           str(args.bn_batches), "1" if profile else "0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {cmd} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        m, method, bs, warmup, steps, bn_batches, profile = argv[1:]
        torch.set_num_threads(int(os.environ.get("SWALAB_BENCH_THREADS", "1")))
        print(json.dumps(child(m, method, int(bs), int(warmup), int(steps), int(bn_batches), profile == "1")))
        return {}
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["preresnet20", "preresnet164"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 16], help="one per model")
    p.add_argument("--methods", nargs="+", default=["sgd", "ema"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="profiled / timed step cycles (a multiple of 10)")
    p.add_argument("--bn-batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per side (interleaved)")
    p.add_argument("--baseline", default=None, help="commit to compare with (default: merge base with main)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.steps % 10:
        p.error("--steps must be a multiple of 10 (the bar's postfix runs every 10 steps)")
    baseline = args.baseline or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True,
                                               text=True, check=True).stdout.strip()
    sides = {"before": export(baseline), "after": ROOT / "src"}
    results = []
    for model, bs in zip(args.models, args.batch_sizes):
        for method in args.methods:
            row = {"model": model, "method": method, "batch_size": bs}
            for side, src in sides.items():
                row[side] = run_child(src, args, model, method, bs, profile=True)
                del row[side]["model"], row[side]["method"], row[side]["batch_size"]
            timed = {side: [] for side in sides}
            for _ in range(args.rounds):
                for side, src in sides.items():
                    timed[side].append(run_child(src, args, model, method, bs, profile=False))
            for side in sides:
                row[side]["step_seconds"] = median([t["step_seconds"] for t in timed[side]])
                row[side]["bn_batch_seconds"] = median([t["bn_batch_seconds"] for t in timed[side]])
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    payload = {"benchmark": "host_syncs", "baseline_commit": baseline,
               "command": "python bench/host_syncs.py " + " ".join(argv),
               "machine": machine_info(torch.device("cpu")),
               "method": "CPU torch.profiler; syncs = calls of " + ", ".join(SYNC_OPS) + " (module doc)",
               "settings": {"warmup_steps": args.warmup, "profiled_steps": args.steps, "bn_batches": args.bn_batches,
                            "rounds": args.rounds, "threads_per_child": int(os.environ.get("SWALAB_BENCH_THREADS", "1")),
                            "progress": "run.progress=null, stderr not a terminal", "data": "random uint8 32x32"},
               "results": results}
    write_result("host_syncs", torch.device("cpu"), payload, args.out)
    return payload


if __name__ == "__main__":
    main()
