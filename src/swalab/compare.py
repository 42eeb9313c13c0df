"""Compare finished runs on their test sets: SWA vs FGE vs EMA vs SGD, and the section 3.5 diagnostics.

    python -m swalab.compare <run dir> <run dir> ... [--out compare.json] [--device auto]

Each run's predictors are rebuilt from its directory (``swalab.runs.load_run``):

* ``sgd``: the live weights of ``final.pt`` (not for FGE runs, whose last iterate is mid-cycle);
* ``swa`` / ``ema``: the method's weights in ``final.pt`` (BN statistics as they were scored);
* ``fge``: the ensemble, from the member weights in ``members/`` when the run saved them
  (``method.save_members=true``), otherwise from the cached member probabilities
  (``fge_member_probs.pt``); with saved members also ``fge_avg``, the average of the members'
  weights with BN statistics recomputed: the paper's "SWA of the FGE proposals" (section 3.5).

It prints accuracy, mean NLL and ECE per predictor, then the section 3.5 numbers: the mean L2
distance of class probabilities and the label agreement between consecutive FGE members, and
between every single model (``swa``, ``fge_avg``) and each FGE ensemble scored on the same test
labels. With ``--out`` everything is also written there as JSON (nothing is written without it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import torch

from swalab.diagnostics import section35
from swalab.evaluate import metrics_from_probs
from swalab.runs import LoadedRun, load_run

SINGLE_MODELS = ("swa", "fge_avg")  # predictors held against an FGE ensemble


def average_members(run: LoadedRun) -> torch.nn.Module:
    """The mean of the saved members' weights, with BN statistics recomputed on the training data."""
    paths = run.member_paths()
    model = run.member_model(paths[0])
    params = [p.detach().clone().double() for p in model.parameters()]
    for path in paths[1:]:
        for acc, p in zip(params, run.member_model(path).parameters()):
            acc += p.detach().double()
    with torch.no_grad():
        for p, acc in zip(model.parameters(), params):
            p.copy_((acc / len(paths)).to(p.dtype))
    run.update_bn(model)
    return model


def run_predictions(run: LoadedRun) -> tuple[dict[str, torch.Tensor], list[torch.Tensor] | None]:
    """Test probabilities of every predictor of one run, and its FGE member probabilities (if any)."""
    probs: dict[str, torch.Tensor] = {}
    members = None
    if run.method == "fge":
        if run.member_paths():
            members = [run.probs(run.member_model(p)) for p in run.member_paths()]
            probs["fge_avg"] = run.probs(average_members(run))
        else:
            members = run.cached_member_probs()
        if not members:
            raise FileNotFoundError(f"{run.run_dir}: an FGE run with neither members/ nor fge_member_probs.pt")
        probs["fge"] = torch.stack(members).mean(dim=0)
    else:
        probs["sgd"] = run.probs(run.model)
    for name in sorted(run.weights):
        probs[name] = run.probs(run.model_for(name).to(run.device))
    return probs, members


def unique_labels(runs: Sequence[LoadedRun]) -> list[str]:
    labels, seen = [], {}
    for run in runs:
        label = run.label
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return labels


def compare(run_dirs: Sequence[str | Path], device: str = "auto") -> dict:
    """Score every predictor of every run and compute the section 3.5 diagnostics."""
    runs = [load_run(d, device=device) for d in run_dirs]
    labels = unique_labels(runs)
    table: dict[str, dict] = {}
    per_run = {}
    for label, run in zip(labels, runs):
        probs, members = run_predictions(run)
        test_labels = run.test_labels()
        for name, p in probs.items():
            table[f"{label}/{name}"] = metrics_from_probs(p, test_labels)
        per_run[label] = {"probs": probs, "members": members, "labels": test_labels}
    diagnostics: dict[str, dict] = {}
    for label, info in per_run.items():
        if info["members"] is None:
            continue
        single = {f"{label}/{name}": info["probs"][name] for name in SINGLE_MODELS if name in info["probs"]}
        for other, oinfo in per_run.items():
            if other != label and torch.equal(oinfo["labels"], info["labels"]) and "swa" in oinfo["probs"]:
                single[f"{other}/swa"] = oinfo["probs"]["swa"]
        diagnostics[f"{label}/fge"] = section35(info["members"], single)
    return {"runs": {label: str(run.run_dir) for label, run in zip(labels, runs)},
            "predictors": table, "section35": diagnostics}


def format_report(result: dict) -> str:
    width = max([len(k) for k in result["predictors"]] + [9])
    lines = [f"{'predictor':<{width}} {'acc %':>8} {'nll':>8} {'ece':>8}"]
    for name, m in result["predictors"].items():
        lines.append(f"{name:<{width}} {m['acc']:8.2f} {m['nll']:8.4f} {m['ece']:8.4f}")
    for ens, d in result["section35"].items():
        lines.append(f"\nsection 3.5, {ens} ({d['members']} members)    [paper: 0.126 / <= 87.33% consecutive; "
                     "0.079 / 95.26% SWA vs FGE]")
        if d["consecutive"] is not None:
            c = d["consecutive"]
            lines.append(f"  consecutive members: mean L2 {c['mean_l2']:.4f}, agreement mean "
                         f"{c['mean_agreement']:.2f}% max {c['max_agreement']:.2f}%")
        for name, pair in d["vs_ensemble"].items():
            lines.append(f"  {name} vs ensemble: mean L2 {pair['l2']:.4f}, agreement {pair['agreement']:.2f}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m swalab.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (each with config.yaml and final.pt)")
    parser.add_argument("--out", default=None, help="also write the results as JSON to this file")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    args = parser.parse_args(argv)
    result = compare(args.runs, device=args.device)
    print(format_report(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\n[swalab] wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
