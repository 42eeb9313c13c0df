"""How much of the training set the BN update of an average needs: accuracy, NLL and time per fraction.

Issue 39 asks for the BN update of an average at no more than 30% of an epoch, or a subset default whose accuracy
and NLL are shown equal to the full pass. This measures the second on a finished run: the run's averaged weights
(``<run dir>:swa`` by default) get their BatchNorm statistics recomputed by ``swalab.evaluate.recompute_bn`` on
``trainer.bn_update_fraction`` of the training set (the loader the trainer builds for it: a fixed subset drawn with
``seed + 1``), for each fraction and each of several subset seeds, and are scored on the whole test set in float32,
as a run scores them. Reported per fraction: the accuracy and NLL of every draw, their spread, and the seconds of
the BN pass (median over draws). A fraction of 1 is the whole set; its draws differ only in augmentation. The
network takes the run's memory layout (``run.channels_last``) as the trainer does; ``bn_fraction_preresnet164_cuda
.json`` was measured before it did (NCHW weights fed channels_last batches), so its seconds are slower than a run's
BN update: read them against each other, not against an epoch.

Usage (after a run, e.g. ``python run.py dataset=cifar10 model=preresnet164 method=swa ...``)::

    python bench/bn_fraction.py <run dir> --fractions 1 0.5 0.25 0.1 0.05 --draws 3 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import machine_info, pick_device, sync, write_result  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from swalab.evaluate import metrics_from_log_probs, predict_log_probs, recompute_bn  # noqa: E402
from swalab.results.runs import open_run  # noqa: E402
from swalab.runweights import load_weights  # noqa: E402
from swalab.train.build import build_loaders  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a finished run directory with final.pt")
    p.add_argument("--weights", default="swa", help="which weights of the run: swa (default), ema, sgd")
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1, 0.05])
    p.add_argument("--draws", type=int, default=3, help="subset seeds per fraction (seed, seed+1, ...)")
    p.add_argument("--device", default="auto", help="cpu | cuda | auto")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if any(not 0 < f <= 1 for f in args.fractions):
        p.error("--fractions: each in (0, 1]")
    device = pick_device(args.device)
    run = open_run(args.run)
    data = run.data()
    model = run.model(data).to(device)
    if bool(run.cfg.run.channels_last):  # the layout the trainer gives it (its loaders already yield channels_last)
        model = model.to(memory_format=torch.channels_last)
    weights = load_weights(f"{args.run}:{args.weights}")
    seed = int(run.cfg.seed)
    rows = []
    for fraction in args.fractions:
        draws = []
        for k in range(args.draws):
            cfg = OmegaConf.merge(run.cfg, {"trainer": {"bn_update_fraction": fraction}, "seed": seed + k})
            _, test, bn = build_loaders(cfg, data, device)
            model.load_state_dict(weights)
            sync(device)
            start = time.perf_counter()
            recompute_bn(model, bn, device)
            sync(device)
            seconds = time.perf_counter() - start
            metrics = metrics_from_log_probs(predict_log_probs(model, test, device), data.test.labels)
            draws.append({"subset_seed": seed + k + 1, "bn_images": int(getattr(bn, "num_samples", 0)) or None,
                          "bn_seconds": seconds, "accuracy": metrics["acc"], "nll": metrics["nll"]})
            print(f"fraction {fraction:<5} draw {k}: acc {metrics['acc']:.2f}  nll {metrics['nll']:.4f}  "
                  f"bn {seconds:.2f} s", flush=True)
        accs, nlls = [d["accuracy"] for d in draws], [d["nll"] for d in draws]
        rows.append({"fraction": fraction, "draws": draws,
                     "accuracy_mean": statistics.fmean(accs), "accuracy_range": [min(accs), max(accs)],
                     "nll_mean": statistics.fmean(nlls), "nll_range": [min(nlls), max(nlls)],
                     "bn_seconds_median": statistics.median(d["bn_seconds"] for d in draws)})
    payload = {"benchmark": "bn_fraction",
               "command": "python bench/bn_fraction.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": machine_info(device),
               "settings": {"run": "/".join(Path(args.run).resolve().parts[-5:]), "model": run.cfg.model.name, "dataset": run.cfg.dataset.name,
                            "method": run.cfg.method.name, "epochs": int(run.cfg.trainer.epochs),
                            "weights": args.weights, "train_images": len(data.train),
                            "test_images": len(data.test), "batch_size": int(run.cfg.trainer.batch_size)},
               "fractions": rows}
    write_result("bn_fraction", device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
