"""Compare finished runs on their test sets: SWA vs FGE vs EMA vs SGD, and the section 3.5 diagnostics.

    python -m swalab.results.compare <run dir> <run dir> ... [--out compare.json] [--device auto]

Each run's predictors are rebuilt from its directory (``swalab.results.runs.open_run``):

* the live weights of ``final.pt``, under the name the run's method gives them (``Method.live``): ``sgd``, ``map`` of a
  Laplace run, ``pretrained`` of a pretrained one (none for FGE runs, whose last iterate is mid-cycle);
* ``swa`` / ``ema``: the method's weights in ``final.pt`` (BN statistics as they were scored);
* ``fge``: the ensemble, from the member weights in ``members/`` when the run saved them
  (``model.fge.save_members=true``), otherwise from the cached member probabilities
  (``fge_member_probs.pt``); with saved members also ``fge_avg``, the average of the members'
  weights with BN statistics recomputed: the paper's "SWA of the FGE proposals" (section 3.5).

It prints accuracy, mean NLL and ECE per predictor, then the section 3.5 numbers: the mean L2
distance of class probabilities and the label agreement between consecutive FGE members, and
between every single model (``swa``, ``fge_avg``) and each FGE ensemble scored on the same test
labels. With ``--out`` everything is also written there as JSON (nothing is written without it)."""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch.optim.swa_utils import AveragedModel

from swalab.checkpoint import read_torch_file
from swalab.results.diagnostics import section35
from swalab.evaluate import (ensemble_log_mean, labels_of, metrics_from_log_probs, metrics_table, predict_log_probs,
                             recompute_bn)
from swalab.results.runs import Run, open_run
from swalab.cli import described, output_file, run_command
from swalab.config import ConfigError
from swalab.identity import label_of
from swalab.train.build import build_val_loader, load_into
from swalab.rundir import write_text
from swalab.runweights import unfinished
from swalab.distributed import select_device

SINGLE_MODELS = ("swa", "fge_avg")  # predictors held against an FGE ensemble


@dataclass
class Scored:
    """A run opened for scoring: its network on ``device``, its test and BN-update loaders and test labels."""

    run: Run
    device: torch.device
    model: torch.nn.Module
    test_loader: object
    bn_loader: object
    val_loader: object = None  # the validation split's (dataset.val_size), or None without one

    @property
    def label(self) -> str:
        return self.run.label

    def model_for(self, weights: dict[str, torch.Tensor], source: str) -> torch.nn.Module:
        """A copy of the network carrying ``weights`` (from ``source``, named in errors)."""
        model = copy.deepcopy(self.model)
        load_into(model, weights, source)
        return model.to(self.device)

    def log_probs(self, model: torch.nn.Module) -> torch.Tensor:
        """Log-probabilities of ``model`` on the run's test set (CPU, computed in float32 as the run scored them)."""
        return predict_log_probs(model, self.test_loader, self.device)

    def test_labels(self) -> torch.Tensor:
        return labels_of(self.test_loader)

    def update_bn(self, model: torch.nn.Module) -> None:
        """Recompute ``model``'s BN statistics over the run's BN-update data, as the trainer does."""
        recompute_bn(model, self.bn_loader, self.device)


def finished_run(run_dir: str | Path) -> Run:
    """``run_dir`` as a finished run, or ``FileNotFoundError`` in one line: it is no run directory, or it has not
    finished (its newest checkpoint is not its result). Cheap: commands check every run given with it before they
    score or write anything."""
    run = open_run(run_dir)
    why = unfinished(run.path, epoch_pick=False)
    if why is not None:
        raise FileNotFoundError(why)
    return run


def score_run(run_dir: str | Path, device: str = "auto") -> Scored:
    """Open ``run_dir`` for scoring: the live weights loaded, the loaders on ``device`` (the validation split's too,
    when the run has one)."""
    run = finished_run(run_dir)
    dev = select_device(device, "--device")
    data = run.data()
    _, test_loader, bn_loader = run.loaders(data, dev)
    model = run.model(data)
    load_into(model, run.weights("live"), f"{run_dir}/final.pt")
    return Scored(run=run, device=dev, model=model.to(dev).eval(), test_loader=test_loader, bn_loader=bn_loader,
                  val_loader=build_val_loader(run.cfg, data, dev))


def average_members(scored: Scored) -> torch.nn.Module:
    """The mean of the saved members' weights (``torch.optim.swa_utils.AveragedModel``), with BN statistics
    recomputed on the training data: the paper's "SWA of the FGE proposals" (section 3.5)."""
    paths = scored.run.member_paths()
    averaged = None
    for path in paths:
        member = scored.model_for(read_torch_file(path)["model"], str(path))
        averaged = AveragedModel(member) if averaged is None else averaged
        averaged.update_parameters(member)
    model = averaged.module
    scored.update_bn(model)
    return model


def run_predictions(scored: Scored) -> tuple[dict[str, torch.Tensor], list[torch.Tensor] | None]:
    """Test log-probabilities of every predictor of one run, and its FGE members' (if any)."""
    run = scored.run
    log_probs: dict[str, torch.Tensor] = {}
    members = None
    if run.method == "fge":
        if run.member_paths():
            members = [scored.log_probs(scored.model_for(read_torch_file(p)["model"], str(p)))
                       for p in run.member_paths()]
            log_probs["fge_avg"] = scored.log_probs(average_members(scored))
        else:
            members = run.cached_member_log_probs()
        if not members:
            raise FileNotFoundError(f"{run.path}: an FGE run with neither members/ nor fge_member_probs.pt")
        log_probs["fge"] = ensemble_log_mean(members)
    if run.live is not None:  # named as the method names it in metrics.json (Method.live)
        log_probs[run.live] = scored.log_probs(scored.model)
    for name in run.method_weights():
        log_probs[name] = scored.log_probs(scored.model_for(run.weights(name), f"{run.path}/final.pt[{name}]"))
    return log_probs, members


def unique_labels(runs: Sequence[Scored]) -> list[str]:
    """``swa/seed0`` for a run of its method's defaults, ``swa/seed0[model.swa.lr=0.05]`` for one of other settings
    (what sets it apart, in the keys a user types); two runs still alike are told apart by their directories."""
    labels = []
    for scored in runs:
        run = scored.run
        apart = {k: v for k, v in (run.apart or {}).items()}
        labels.append(run.label + (f"[{label_of(apart)}]" if apart else ""))
    repeated = {label for label in labels if labels.count(label) > 1}
    return [f"{label}[{scored.run.path}]" if label in repeated else label for label, scored in zip(labels, runs)]


def differences_between(runs: Sequence[Scored], test_labels: Sequence[torch.Tensor]) -> list[str]:
    """What a reader must know before setting the runs side by side: other data sets, other test sets, other lengths."""
    notes = []
    datasets = sorted({s.run.dataset_name for s in runs})
    if len(datasets) > 1:
        notes.append(f"the runs are on different data sets ({', '.join(datasets)}): their numbers are not comparable")
    if any(len(t) != len(test_labels[0]) or not torch.equal(t, test_labels[0]) for t in test_labels[1:]):
        notes.append("the runs were scored on different test sets (other images or test_size): their numbers are not "
                     "comparable, and no section 3.5 pair crosses them")
    epochs = sorted({int(s.run.get("trainer.epochs", 0) or 0) for s in runs})
    if len(epochs) > 1:
        notes.append(f"the runs trained for different lengths ({', '.join(map(str, epochs))} epochs)")
    return notes


def compare(run_dirs: Sequence[str | Path], device: str = "auto") -> dict:
    """Score every predictor of every run and compute the section 3.5 diagnostics."""
    runs = [score_run(d, device=device) for d in run_dirs]
    labels = unique_labels(runs)
    table: dict[str, dict] = {}
    per_run = {}
    for label, run in zip(labels, runs):
        log_probs, members = run_predictions(run)
        test_labels = run.test_labels()
        for name, p in log_probs.items():
            table[f"{label}/{name}"] = metrics_from_log_probs(p, test_labels)
        per_run[label] = {"probs": {name: p.exp() for name, p in log_probs.items()},
                          "members": None if members is None else [m.exp() for m in members], "labels": test_labels}
    diagnostics: dict[str, dict] = {}
    for label, info in per_run.items():
        if info["members"] is None:
            continue
        single = {f"{label}/{name}": info["probs"][name] for name in SINGLE_MODELS if name in info["probs"]}
        for other, oinfo in per_run.items():
            if other != label and torch.equal(oinfo["labels"], info["labels"]) and "swa" in oinfo["probs"]:
                single[f"{other}/swa"] = oinfo["probs"]["swa"]
        diagnostics[f"{label}/fge"] = section35(info["members"], single)
    notes = differences_between(runs, [info["labels"] for info in per_run.values()])
    return {"runs": {label: str(run.run.path) for label, run in zip(labels, runs)},
            "predictors": table, "section35": diagnostics, "notes": notes}


def format_report(result: dict) -> str:
    lines = [f"note: {n}" for n in result.get("notes", [])] + [metrics_table(result["predictors"])]
    for ens, d in result["section35"].items():
        members = f"{d['members']} member" + ("s" if d["members"] != 1 else "")
        lines.append(f"\nsection 3.5, {ens} ({members})    [paper: 0.126 / <= 87.33% consecutive; "
                     "0.079 / 95.26% SWA vs FGE]")
        if d["consecutive"] is not None:
            c = d["consecutive"]
            lines.append(f"  consecutive members: mean L2 {c['mean_l2']:.4f}, agreement mean "
                         f"{c['mean_agreement']:.2f}% max {c['max_agreement']:.2f}%")
        for name, pair in d["vs_ensemble"].items():
            lines.append(f"  {name} vs ensemble: mean L2 {pair['l2']:.4f}, agreement {pair['agreement']:.2f}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m swalab.results.compare", description=described(__doc__))
    parser.add_argument("runs", nargs="+", help="run directories (each with config.yaml and final.pt)")
    parser.add_argument("--out", default=None, help="also write the results as JSON to this file")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    args = parser.parse_args(argv)
    out = output_file(args.out, "--out") if args.out else None  # checked before any scoring
    try:
        select_device(args.device)
    except ConfigError:
        raise ConfigError(f"--device {args.device}: no such device here (CUDA visible: "
                          f"{torch.cuda.is_available()}); use --device auto or cpu") from None
    result = compare(args.runs, device=args.device)
    print(format_report(result))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, json.dumps(result, indent=2) + "\n")
        print(f"\n[swalab] wrote {out}")
    return result


if __name__ == "__main__":
    run_command(main, prog="swalab.results.compare", interrupted="nothing was written (--out is written last)")
