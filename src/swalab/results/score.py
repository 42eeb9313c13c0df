"""Score finished runs again on other data: the stored predictors of each run on another test set.

    python -m swalab.results.score <run dir>... [--data <spec> ...] [--ood <spec> ...] [--device auto]

When and why: SWA, SWAG, ensembles and temperature scaling are argued for under distribution shift (Ovadia et al.
2019); a run is scored at its end on its own test split only, and this command sets its predictors on other images
without training anything. Each run is opened as ``swalab.results.compare.score_run`` opens it (its network, weights
and loaders, rebuilt from its directory); the other test set goes through the run's own test loader (its
normalisation, its batch size), and every predictor whose weights the run kept is scored by
``swalab.evaluate.metrics_from_log_probs``: the live weights (under their method's name for them, ``Method.live``:
``sgd``, ``pretrained``, ``map`` of a Laplace run), ``swa`` / ``ema`` (``final.pt``), ``fge``
and ``fge_avg`` (saved members), ``swag`` and ``swag_diag`` (samples drawn again from the moments in the kept
checkpoint of the run's last epoch; ``--swag-samples``), ``laplace`` of a ``method=laplace`` run (its
posterior fitted again; both in ``swalab.results.rebuilt``), and each ``<name>+ts`` at
the temperature the run fitted on its validation split. What cannot be scored again is listed, with why, under
``not_scored`` (a budget mark's average, an FGE ensemble without saved members, a SWAG run that kept no checkpoint
of its last epoch: only their test predictions are kept; a post-hoc average only its scores).

Data specs (``--data``, several allowed; all parsed before any run is opened):

* ``test``: the run's own test split (a check: the same numbers as the run's ``metrics.json``);
* ``cifar10c:<corruption>:<severity>``, ``cifar10c:<corruption>`` (severities 1 to 5), ``cifar10c:all``: the run's
  test split corrupted as CIFAR-10-C (``swalab.data.corruptions``: seeded, cached, fingerprinted).

Each set is written to ``<run>/scores/<name>/metrics.json`` (the data's name, spec and fingerprints, each
predictor's acc, NLL, ECE (15 equal-width and 20 equal-mass bins), Brier, and ``not_scored``) and ``predictions.pt``;
with corruptions, the mean per severity over every corruption scored so far (this command's and earlier ones') to
``<run>/scores/cifar10c-summary.json``. ``--ood <spec>``
(``noise:gaussian``, ``noise:uniform``, ``folder:<dir>``, ``other-classes``; ``swalab.results.ood``) sets each predictor's uncertainty on
the run's test split against those images (AUROC, AUPR, FPR at 95% TPR per score) in
``<run>/scores/ood-<name>/metrics.json``, and each image's scores (float16) in ``per_image_scores.pt`` beside it. The run's own records are never touched.

Each record is whole or absent (``swalab.rundir.write_record``: its ``metrics.json`` written last, the earlier one
removed first), and ``<run>/scores/`` is locked while a command scores the run (a second one is refused in one line);
every run given is checked before any is scored. A set whose record an earlier command wrote from the same files of
the run (fingerprinted: ``final.pt``, ``metrics.json``, members, checkpoints), the same number of SWAG samples drawn and the
same images is kept, not scored again (``--again`` scores it again): the same command started again after an interruption
or a time limit goes on where the first stopped, and one run trained again is scored anew."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from swalab.calibration import SUFFIX, scaled, scaled_name
from swalab.checkpoint import atomic_save, save_predictions
from swalab.cli import described, each_once, first_of_each, run_command
from swalab.config import ConfigError
from swalab.data import corruptions
from swalab.data.splits import DataSplit
from swalab.results import ood
from swalab.evaluate import ECE_LEGEND, metrics_from_log_probs, metrics_table
from swalab.results.compare import Scored, finished_run, run_predictions, score_run
from swalab.results.rebuilt import Rebuilt, rebuild, samples_drawn
from swalab.rundir import RunDir, file_fingerprint, read_json, write_json, write_record
from swalab.runlock import held_folders

FOLDER = RunDir.SCORES
SUMMARY_FILE = "cifar10c-summary.json"
SUMMARY_METRICS = ("acc", "nll", "ece", "brier")


class ScoreError(ConfigError):
    """A data spec this command cannot make: one line naming ``--data``, the value and the fix."""


@dataclass(frozen=True)
class DataSpec:
    """One other test set: its name (the folder under ``scores/``), the spec typed, and how it is made from the run's
    test split (the made split and its fingerprint)."""

    name: str
    spec: str
    make: Callable[[DataSplit, str | None], tuple[DataSplit, str]]
    corruption: str | None = None
    severity: int | None = None


def parse_data(spec: str) -> list[DataSpec]:
    """The test sets ``spec`` names (see the module doc), or ``ScoreError`` naming it and what is accepted."""
    if spec == "test":
        return [DataSpec("test", spec, lambda split, cache_dir: (split, corruptions.fingerprint(split.images)))]
    kind, _, rest = spec.partition(":")
    if kind != "cifar10c" or not rest:
        raise ScoreError(f"--data {spec}: expected test, cifar10c:<corruption>:<severity>, cifar10c:<corruption> or "
                         "cifar10c:all")
    name, _, severity = rest.partition(":")
    names = list(corruptions.MADE) if name == "all" else [name]
    if severity and not severity.isdigit():
        raise ScoreError(f"--data {spec}: the severity {severity!r} must be 1 to 5")
    severities = [int(severity)] if severity else list(corruptions.SEVERITIES)
    out = []
    for c in names:
        for s in severities:
            try:
                corruptions.check(c, s)
            except corruptions.CorruptionError as err:
                raise ScoreError(f"--data {spec}: {err}") from None
            out.append(DataSpec(f"cifar10c-{c}-{s}", spec, _corrupter(c, s), corruption=c, severity=s))
    return out


def _corrupter(corruption: str, severity: int):
    return lambda split, cache_dir: corruptions.corrupted_split(split, corruption, severity, cache_dir=cache_dir)


def on_other_data(scored: Scored, split: DataSplit) -> Scored:
    """``scored`` with its test loader reading ``split`` instead: the run's own loader settings and normalisation."""
    run = scored.run
    data = run.data()
    _, test_loader, _ = run.loaders(dataclasses.replace(data, test=split), scored.device)
    return dataclasses.replace(scored, test_loader=test_loader)


def not_rescorable(scored: Scored, names: Sequence[str], rebuilt: Rebuilt | None = None) -> dict[str, str]:
    """Why each predictor of the run's ``metrics.json`` (and ``posthoc/``) not among ``names`` cannot be scored again
    (``rebuilt``: why the run's posterior could not be rebuilt, ``swalab.results.rebuilt``)."""
    why_not = rebuilt.why_not if rebuilt is not None else {}
    why = {}
    for name in [*scored.run.metrics, *scored.run.posthoc]:
        if name in names or "acc" not in (scored.run.metrics.get(name) or scored.run.posthoc.get(name) or {}):
            continue
        kind = next((prefix for prefix in why_not if name.startswith(prefix)), None)
        if kind is not None:
            why[name] = why_not[kind]
        elif name in scored.run.posthoc:
            why[name] = "a post-hoc average: its weights are not kept (python -m swalab.posthoc builds it again)"
        elif name.startswith("swa@"):
            why[name] = "a budget mark: the run kept its test predictions, not its weights"
        elif name.startswith("fge"):
            why[name] = "the run saved no FGE members (model.fge.save_members=true keeps them)"
        else:
            why[name] = "no weights of it in final.pt"
    return why


def not_scored_lines(why: dict[str, str]) -> list[str]:
    """``name: why`` per predictor that was not scored again, its ``+ts`` named with it when for the same reason (a
    post-hoc average and its temperature-scaled twin are one line, not two)."""
    out = []
    for name, reason in why.items():
        if name.endswith(SUFFIX) and why.get(name.removesuffix(SUFFIX)) == reason:
            continue
        also = f" (and {name}{SUFFIX})" if why.get(f"{name}{SUFFIX}") == reason else ""
        out.append(f"{name}{also}: {reason}")
    return out


def predictions_on(scored: Scored, split: DataSplit, rebuilt: Rebuilt | None = None
                   ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor] | None]:
    """The log-probabilities on ``split`` of every predictor of the run whose weights it kept and of those ``rebuilt``
    holds (``+ts`` at the run's own temperatures), and its FGE members' (None without saved members)."""
    other = on_other_data(scored, split)
    members = None
    if scored.run.method == "fge" and not scored.run.member_paths():
        log_probs = {}  # compare would fall back on the cached members' predictions: those of the run's own test set
        for name in scored.run.method_weights():
            log_probs[name] = other.log_probs(other.model_for(scored.run.weights(name), f"{scored.run.path}/final.pt"))
    else:
        log_probs, members = run_predictions(other)
    if rebuilt is not None:
        log_probs.update(rebuilt.log_probs(other))
    for name in list(log_probs):
        fitted = (scored.run.metrics.get(scaled_name(name)) or {}).get("temperature")
        if fitted is not None:  # the run's own temperature, fitted on its validation split
            log_probs[scaled_name(name)] = scaled(log_probs[name], float(fitted))
    return log_probs, members


def score_on(scored: Scored, spec: DataSpec, rebuilt: Rebuilt | None = None,
             made: tuple[DataSplit, str] | None = None, inputs: dict | None = None) -> dict:
    """Every re-scorable predictor of one run on ``spec``'s test set (``made``: that set and its fingerprint, when
    the caller made it), written under ``<run>/scores/<name>/`` with what it was made from (``inputs``,
    :func:`scoring_inputs`)."""
    split, made = made or spec.make(scored.run.data().test, scored.run.get("run.cache_dir"))
    log_probs, _ = predictions_on(scored, split, rebuilt)
    labels = split.labels
    metrics = {name: metrics_from_log_probs(p, labels) for name, p in log_probs.items()}
    record = {"data": {"name": spec.name, "spec": spec.spec, "images": len(labels), "fingerprint": made,
                       **({"corruption": spec.corruption, "severity": spec.severity} if spec.corruption else {})},
              "ece_bins": ECE_LEGEND, "predictors": metrics, "not_scored": not_rescorable(scored, list(log_probs), rebuilt),
              **(rebuilt.record if rebuilt is not None else {}), **({"inputs": inputs} if inputs is not None else {})}
    write_record(scored.run.path / FOLDER / spec.name, record,
                 {RunDir.PREDICTIONS: lambda path: save_predictions(log_probs, labels, path)})
    return record


def ood_images(scored: Scored, spec: str) -> DataSplit:
    """The images of the OOD set ``spec`` for the run (``other-classes``: its data set's classes it left out)."""
    if spec == ood.OTHER_CLASSES:
        return scored.run.other_classes_test()
    return ood.ood_split(spec, scored.run.data().test)


def detect_ood(scored: Scored, spec: str, rebuilt: Rebuilt | None = None, outside: DataSplit | None = None,
               inputs: dict | None = None) -> dict:
    """Each re-scorable predictor's OOD detection (``swalab.results.ood``): the run's test split against ``spec``'s
    images (``outside``, when the caller made them), written under ``<run>/scores/ood-<name>/metrics.json`` with
    what it was made from (``inputs``), each image's scores (float16) beside it in ``per_image_scores.pt`` (the
    report draws ROC curves from them)."""
    own = scored.run.data().test
    outside = outside if outside is not None else ood_images(scored, spec)
    in_log_probs, in_members = predictions_on(scored, own, rebuilt)
    out_log_probs, out_members = predictions_on(scored, outside, rebuilt)
    per_image = {}
    for name, p in in_log_probs.items():
        ensemble = name in ("fge", "fge+ts") and in_members is not None
        per_image[name] = ood.per_image(p, out_log_probs[name], in_members if ensemble else None,
                                        out_members if ensemble else None)
    detected = {name: {score: ood.detection(ins, outs) for score, (ins, outs) in by.items()}
                for name, by in per_image.items()}
    record = {"data": {"name": ood.spec_name(spec), "spec": spec, "in_distribution": len(own.labels),
                       "out_of_distribution": len(outside.labels),
                       "fingerprint": corruptions.fingerprint(outside.images)},
              "positive": "out-of-distribution", "predictors": detected,
              "not_scored": not_rescorable(scored, list(in_log_probs), rebuilt),
              **(rebuilt.record if rebuilt is not None else {}), **({"inputs": inputs} if inputs is not None else {})}
    write_record(scored.run.path / FOLDER / ood.spec_name(spec), record,  # the report's ROC curves read the scores
                 {ood.PER_IMAGE_FILE: lambda path: atomic_save(ood.kept_scores(per_image), path)})
    return record


def ood_table(record: dict) -> str:
    """``predictor  score  auroc  aupr  fpr95`` lines of one OOD record."""
    width = max([len(n) for n in record["predictors"]] + [9])
    lines = [f"{'predictor':<{width}} {'score':>18} {'auroc':>8} {'aupr':>8} {'fpr95':>8}"]
    for name, by_score in record["predictors"].items():
        for score, m in by_score.items():
            lines.append(f"{name:<{width}} {score:>18} {m['auroc']:8.4f} {m['aupr']:8.4f} {m['fpr95']:8.4f}")
    return "\n".join([*lines, "OOD images are the positives; fpr95: in-distribution images flagged at 95% OOD recall"])


def severity_summary(records: Sequence[dict]) -> dict:
    """Per predictor and severity, the mean over the corruptions scored of acc, NLL, ECE and Brier (and their count)."""
    out: dict[str, dict] = {}
    for r in records:
        severity = r["data"].get("severity")
        if severity is None:
            continue
        for name, m in r["predictors"].items():
            cell = out.setdefault(name, {}).setdefault(str(severity), {"corruptions": 0, **{k: 0.0 for k in SUMMARY_METRICS}})
            cell["corruptions"] += 1
            for k in SUMMARY_METRICS:
                cell[k] += m[k]
    for by_severity in out.values():
        for cell in by_severity.values():
            for k in SUMMARY_METRICS:
                cell[k] /= cell["corruptions"]
    return out


def summary_table(summary: dict) -> str:
    """``predictor  severity  corruptions  acc %  nll  ece  brier`` lines of :func:`severity_summary`."""
    width = max([len(n) for n in summary] + [9])
    lines = [f"{'predictor':<{width}} {'severity':>8} {'corrupt.':>8} {'acc %':>8} {'nll':>8} {'ece':>8} {'brier':>8}"]
    for name, by_severity in summary.items():
        for s, c in sorted(by_severity.items()):
            lines.append(f"{name:<{width}} {s:>8} {c['corruptions']:>8} {c['acc']:8.2f} {c['nll']:8.4f} "
                         f"{c['ece']:8.4f} {c['brier']:8.4f}")
    return "\n".join([*lines, "mean over the corruptions scored; ece: 15 equal-width confidence bins (Guo et al. 2017)"])


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m swalab.results.score", description=described(__doc__))
    parser.add_argument("runs", nargs="+", help="finished run directories")
    parser.add_argument("--data", action="append", default=[],
                        help="test | cifar10c:<corruption>:<severity> | cifar10c:<corruption> | cifar10c:all; once per set "
                             "(--data test --data cifar10c:all)")
    parser.add_argument("--ood", action="append", default=[],
                        help="noise:gaussian | noise:uniform | folder:<dir> | other-classes (those dataset.classes left out): OOD "
                             "detection against the run's test split; once per set")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    parser.add_argument("--again", action="store_true",
                        help="score every set again, even one an earlier command scored from the same weights and images")
    parser.add_argument("--swag-samples", type=int, default=None,
                        help="SWAG runs: samples drawn again (default: the run's method.samples); each costs a BN update "
                             "once and a pass over every test set")
    args = parser.parse_args(argv)
    if args.swag_samples is not None and args.swag_samples < 1:
        raise ScoreError(f"--swag-samples {args.swag_samples}: give 1 or more")
    if not args.data and not args.ood:
        raise ScoreError("give --data <spec> (another test set) or --ood <spec> (OOD detection), or both")
    # every spec checked first; a set asked twice (cifar10c:fog:3 and cifar10c:fog, folder:x and folder:./x) once
    specs = first_of_each([d for spec in args.data for d in parse_data(spec)], lambda d: d.name)
    for spec in args.ood:
        try:
            ood.check_spec(spec)
        except ood.OODError as err:
            raise ScoreError(str(err)) from None
    args.ood = first_of_each(args.ood, ood.spec_name)
    for run_dir in args.runs:  # every run checked before any is scored
        finished_run(run_dir)
    with held_folders([Path(run_dir) / FOLDER for run_dir in each_once(args.runs)], "scored"):
        return score_runs(args, specs)


def scoring_inputs(run_dir: Path, swag_samples: int | None) -> dict:
    """What a score record is made from besides its images: a fingerprint of each file of the run that scoring reads
    (``final.pt``; ``metrics.json``, for the temperatures; FGE's members; the checkpoints SWAG's moments come from:
    ``swalab.rundir.file_fingerprint``, no tensor read) and the SWAG samples it draws (``swag_samples``:
    ``swalab.results.rebuilt.samples_drawn``, None for a run that draws none). A later command keeps a record of the
    same inputs and images instead of scoring it again."""
    run_dir = Path(run_dir)
    kept = sorted(str(p.relative_to(run_dir)) for folder in (RunDir.MEMBERS, RunDir.CHECKPOINTS)
                  for p in (run_dir / folder).rglob("*.pt"))
    return {"files": {name: file_fingerprint(run_dir / name) for name in [RunDir.FINAL, RunDir.METRICS, *kept]},
            "swag_samples": swag_samples}


def earlier_record(run_dir: Path, name: str, inputs: dict, fingerprint: str) -> dict | None:
    """The record of ``scores/<name>/`` an earlier command wrote from the same ``inputs`` (:func:`scoring_inputs`)
    on images of the same ``fingerprint``, or None. A record is whole or absent (its ``metrics.json`` is written
    last), so one that reads back is whole."""
    record = read_json(Path(run_dir) / FOLDER / name / RunDir.METRICS)
    if isinstance(record, dict) and record.get("inputs") == inputs and \
            (record.get("data") or {}).get("fingerprint") == fingerprint:
        return record
    return None


def score_runs(args: argparse.Namespace, specs: Sequence[DataSpec]) -> dict:
    """Score every run of ``args`` on ``specs`` and ``args.ood``, printing each table (:func:`main`'s work); a set
    an earlier command scored from the same weights and images is kept (:func:`earlier_record`) unless
    ``args.again``."""
    results = {}
    for run_dir in each_once(args.runs):
        scored = score_run(run_dir, device=args.device)
        inputs = scoring_inputs(scored.run.path, samples_drawn(scored.run, args.swag_samples))
        # built on first use, once: a command that keeps every set fits no posterior again
        posterior = functools.cache(lambda: rebuild(scored, args.swag_samples))

        records = []
        said = set()  # a predictor not scored for one reason is named once per run, not once per set
        for spec in specs:
            split, made = spec.make(scored.run.data().test, scored.run.get("run.cache_dir"))
            record = None if args.again else earlier_record(scored.run.path, spec.name, inputs, made)
            if record is None:
                record = score_on(scored, spec, posterior(), made=(split, made), inputs=inputs)
            else:
                print(f"{scored.label} on {spec.name}: kept, scored before from the same weights and images "
                      "(--again scores it again)")
            records.append(record)
            print(f"{scored.label} on {spec.name} ({record['data']['images']} images):")
            print(metrics_table(record["predictors"]))
            for line in not_scored_lines(record["not_scored"]):
                if line not in said:
                    said.add(line)
                    print(f"  not scored: {line}")
        detections = []
        for spec in args.ood:
            outside = ood_images(scored, spec)
            record = None if args.again else earlier_record(scored.run.path, ood.spec_name(spec), inputs,
                                                            corruptions.fingerprint(outside.images))
            if record is None:
                record = detect_ood(scored, spec, posterior(), outside=outside, inputs=inputs)
            else:
                print(f"{scored.label} against {ood.spec_name(spec)}: kept, scored before from the same weights and "
                      "images (--again scores it again)")
            detections.append(record)
            print(f"{scored.label}: its test split against {record['data']['name']} "
                  f"({record['data']['out_of_distribution']} images):\n{ood_table(record)}")
        scored.run.__dict__.pop("scores", None)  # read again: what this command wrote, and what earlier ones did
        summary = severity_summary([r for name, r in scored.run.scores.items() if name.startswith("cifar10c-")])
        if summary:
            write_json(scored.run.path / FOLDER / SUMMARY_FILE, summary)
            print(f"{scored.label} under corruption, per severity:\n{summary_table(summary)}")
        print(f"[swalab] wrote {scored.run.path / FOLDER}")
        results[str(run_dir)] = {"records": records, "summary": summary, "ood": detections}
    return results


if __name__ == "__main__":
    # every set written before is whole, the one being written has no record
    run_command(main, prog="swalab.results.score",
                interrupted="each set's record is whole (this command's or an earlier one's) or absent; the same "
                            "command keeps the whole ones and scores the rest")
