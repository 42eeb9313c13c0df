"""Averages built after training, from a run's snapshots and final weights, scored like every online predictor.

    python -m swalab.posthoc <run dir>... [--swa A:B ...] [--lawa K ...] [--ema DECAY ...] [--powerema SIGMA_REL ...]
                             [--soup uniform greedy] [--wiseft ALPHA ...] [--select val] [--by nll|acc]
                             [--mark <run dir>...]

Each run (``swalab.results.compare.score_run``: its network, test, BN-update and validation loaders, rebuilt from its
directory) gives its snapshots (``run.snapshots``, ``swalab.snapshots``) in training order, its final live weights
last (unless a snapshot of the last epoch is there), and from them:

* ``swa[A:B]``: the equal-weight mean of every snapshot from epoch A to epoch B, both included (``A:`` to the end);
  the window of a SWA run's capture epochs is its online average (tests/test_posthoc.py);
* ``lawaK``: the mean of the last K snapshots (Kaddour et al. 2022, timm's ``avg_checkpoints.py``);
* ``emaD``: the EMA over the snapshots at decay D per snapshot: snapshot-granular, not per step;
* ``poweremaS``: EDM2's power-function EMA of relative width S at the last snapshot, rebuilt by least squares from
  the power EMAs a run tracked (``run.powerema``) in every snapshot (``swalab.powerema``): per step, any width;
* ``wiseftA``: ``(1 - A) * start + A * final`` for a run started from weights (``model.init_from``, or a timm
  network's pretrained weights: ``model.pretrained``, ``model.pretrained_file``); ``wiseftA[bn-interp]``
  (``--wiseft-bn interpolate``) the same with the BatchNorm statistics interpolated too instead of recomputed;

and across the runs given (one config, other seeds: one group hash, ``swalab.identity``), from their final live
weights: ``soup-uniform(N)``, their mean, and ``soup-greedy(N)``, the greedy soup by validation score (N: the runs
offered). Every result gets its BatchNorm statistics recomputed over the run's training data and is scored by
``swalab.evaluate.score_predictors`` (acc, NLL, ECE, Brier, top-5; on the validation split and as ``+ts`` there when
the run has one), then written to ``<run>/posthoc/<name>/`` (``metrics.json``, ``predictions.pt``), a soup under the
run of its lowest seed (whatever the order given: one soup, one place); the run's own records are never touched.
``metrics.json`` records a fingerprint of every file an average read (``sources``) and the options that build it again
(``rebuild``): once the run's files change, the report leaves it out and says so (``swalab.results.runs.Run.posthoc``).
An average asked again whose record is whole and whose files are unchanged is kept, not built again (``--again``
builds it again): the same command started again after an interruption goes on where the first stopped.
``swalab.results.report`` shows them as predictors of their run. Choices (``--select``, the greedy soup) are made on the validation split only.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from swalab.checkpoint import save_predictions
from swalab.cli import each_once
from swalab.config import ConfigError
from swalab.evaluate import ModelPredictor, labels_of, metrics_from_log_probs, score_predictors
from swalab.identity import differences, group_hash
from swalab.posthoc.averages import State, combination, ema_of, greedy_soup, interpolate, mean_of
from swalab.powerema import check_widths, coefficients, gamma_of, label_of, profile_error
from swalab.results.compare import Scored, score_run
from swalab.results.runs import Run
from swalab.snapshots import Snapshot, per_epoch, snapshots_of
from swalab.runweights import load_init_weights
from swalab.rundir import RunDir, changed_files, file_fingerprint, read_json, write_record

FOLDER = RunDir.POSTHOC
# --wiseft-bn: (family, label suffix, what metrics.json says of the BN statistics). Recomputed over the fine-tune's
# training data, alpha 0 is not the start network (its statistics were those of the start's own training data);
# interpolated like the weights (running means and variances), alpha 0 and 1 are the start and the final networks.
WISEFT_BN = {"recompute": ("wiseft", "", "recomputed"), "interpolate": ("wiseft-bn-interp", "[bn-interp]", "interpolated")}


class PosthocError(ConfigError):
    """A request this command cannot answer honestly: one line naming the option, the value and the fix."""


@dataclass
class Result:
    """One post-hoc predictor: its label, its family and the value it was swept over (the figure's x), its metrics
    (``score_predictors``'s, ``+ts`` included) and where it was written."""

    label: str
    family: str
    knob: float
    run: Path
    metrics: dict = field(default_factory=dict)
    built_from: list[str] = field(default_factory=list)
    path: Path | None = None


# -- what a run offers ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """Weights at a place in training (in epochs), read when needed."""

    position: float
    name: str
    read: Callable[[], State]


def points_of(scored: Scored) -> list[Point]:
    """The run's snapshots in training order, and its final live weights (``final.pt``) after them unless a
    snapshot of its last epoch is there."""
    epochs = int(scored.run.get("trainer.epochs"))
    found = snapshots_of(scored.run.path)
    steps = found[0].steps_per_epoch() if any(s.step for s in found) else 1
    points = [Point(s.position(steps), s.path.name, s.weights) for s in found]
    if not points or points[-1].position < epochs:
        points.append(Point(float(epochs), RunDir.FINAL, lambda: scored.run.weights("live")))
    return points


def check_averaged(points: Sequence[Point], option: str, run: Path, snapshots: float | None = None,
                   epochs: int = 0) -> None:
    """Refuse ``option`` (``--ema 0.5``) for a run whose only weights are its final ones (it wrote no snapshots, or
    none before its last epoch): what it would build is those weights under an average's label. A run trained with
    ``run.snapshots`` (``snapshots``) every ``epochs`` reached whose ``snapshots/`` is empty lost them since."""
    every, _ = per_epoch(snapshots)
    if len(points) < 2 and every and every <= epochs and not snapshots_of(run):
        raise PosthocError(f"{option}: {run} was trained with run.snapshots={snapshots:g}, but its "
                           f"{RunDir.SNAPSHOTS}/ holds none now (removed or not copied): put them back in "
                           f"{Path(run) / RunDir.SNAPSHOTS} to average them")
    if len(points) < 2:
        raise PosthocError(f"{option}: {run} holds its final weights only (no snapshot before them: it was trained "
                           "without run.snapshots, or with snapshots further apart than the run), so there is nothing "
                           "to average: train it again with run.snapshots=1 (a snapshot every epoch) in a directory of "
                           "its own (run.dir=<dir>) or after moving it away: the same command skips it")


def window(text: str) -> tuple[float, float | None]:
    """``A:B`` (``A:``: to the end) as two epochs, or ``PosthocError`` naming ``--swa``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)?\s*", text)
    if not m or (m.group(2) is not None and float(m.group(2)) <= float(m.group(1))):
        raise PosthocError(f"--swa {text}: expected an epoch window A:B with A < B (or A: for A to the end), "
                           "e.g. --swa 12:16")
    return float(m.group(1)), None if m.group(2) is None else float(m.group(2))


def swa_window(points: Sequence[Point], text: str) -> tuple[str, list[Point]]:
    a, b = window(text)
    if b is not None and b > points[-1].position:  # its label would name epochs the run never trained
        raise PosthocError(f"--swa {text}: the run ends at epoch {points[-1].position:g}: give --swa "
                           f"{a:g}:{points[-1].position:g} or --swa {a:g}: (to the end)")
    end = b if b is not None else points[-1].position
    inside = [p for p in points if a <= p.position <= end]
    if len(inside) < 2:
        raise PosthocError(f"--swa {text}: the window holds {len(inside)} snapshot(s) of {len(points)} (epochs "
                           f"{points[0].position:g} to {points[-1].position:g}): an average needs 2; widen it "
                           "or write snapshots more often (run.snapshots)")
    return f"swa[{inside[0].position:g}:{inside[-1].position:g}]", inside  # epochs it read, not the bounds typed


def last_k(points: Sequence[Point], k: int) -> tuple[str, list[Point]]:
    if not 2 <= k <= len(points):
        raise PosthocError(f"--lawa {k}: the run has {len(points)} snapshots (its final weights included); give k "
                           f"from 2 to {len(points)}")
    return f"lawa{k}", list(points[-k:])


def check_decay(decay: float) -> float:
    if not 0 < decay < 1:
        raise PosthocError(f"--ema {decay:g}: a decay per snapshot must lie in (0, 1), e.g. --ema 0.5 0.9")
    return decay


def check_alpha(alpha: float) -> float:
    if not 0 <= alpha <= 1:
        raise PosthocError(f"--wiseft {alpha:g}: alpha must lie in [0, 1] (0: the start, 1: the final weights)")
    return alpha


@dataclass(frozen=True)
class PowerSnapshot:
    """The power EMAs a snapshot holds (``run.powerema``): their step count ``t`` and ``{label: sigma_rel}``."""

    snapshot: Snapshot
    t: int
    sigma_rels: dict[str, float]

    def averages(self) -> dict[str, State]:
        return self.snapshot.read()["powerema"]["averages"]


def power_snapshots(run_dir: Path) -> list[PowerSnapshot]:
    """The run's snapshots that hold power EMAs, in training order (read memory-mapped: only ``t`` is touched)."""
    out = []
    for s in snapshots_of(run_dir):
        power = s.read(mmap=True).get("powerema")
        if power is not None:
            out.append(PowerSnapshot(s, int(power["t"]), {k: float(v) for k, v in power["sigma_rels"].items()}))
    return out


def check_powerema(scored: Scored, widths: Sequence[float]) -> list[PowerSnapshot]:
    """The run's power-EMA snapshots, or ``PosthocError``: a run that tracked none, or too few to fit a width."""
    found = power_snapshots(scored.run.path)
    if not found:
        raise PosthocError(f"--powerema {' '.join(f'{w:g}' for w in widths)}: {scored.run.path} tracked no power EMA; "
                           "train with run.powerema=[0.05,0.10] and run.snapshots (e.g. 1) to rebuild any width later "
                           "(this run again: in a directory of its own, run.dir=<dir>; its own command skips it)")
    return found


def power_ema(found: Sequence[PowerSnapshot], sigma_rel: float) -> tuple[str, State, list[str], dict]:
    """EDM2's power EMA of width ``sigma_rel`` at the last snapshot's step, the least-squares combination of every
    tracked average of every snapshot (``swalab.powerema``); with what it was built from and how well the profile
    was matched (``profile_error``: |rebuilt - target| / |target| in L2 over the steps)."""
    sources = [(float(p.t), gamma_of(s)) for p in found for s in p.sigma_rels.values()]
    target = (float(found[-1].t), gamma_of(sigma_rel))
    x = coefficients(sources, target)
    weights = iter(float(v) for v in x)
    pairs = ((next(weights), average) for p in found for average in p.averages().values())
    widths = sorted({s for p in found for s in p.sigma_rels.values()})
    info = {"sigma_rel": sigma_rel, "gamma": target[1], "t": found[-1].t, "from_sigma_rels": widths,
            "profile_error": profile_error(sources, target, x), "largest_coefficient": float(x.abs().max())}
    return f"powerema{label_of(sigma_rel)}", combination(pairs), [p.snapshot.path.name for p in found], info


def start_weights(scored: Scored) -> tuple[State, str]:
    """The weights a run started from, for WiSE-FT, and where they came from: ``model.init_from``'s, or the
    pretrained weights a timm network was built with (``model.pretrained``, ``model.pretrained_file``: the run's
    network built afresh from its config loads the same weights). Refused for a run that started afresh, and for
    one whose classifier timm initialised at random (a head of another size than the weights'): its start is no
    pretrained network."""
    spec = scored.run.get("model.init_from")
    if spec:
        return load_init_weights(str(spec))[0], str(spec)
    file = scored.run.get("model.pretrained_file")
    if not (file or scored.run.get("model.pretrained")):
        raise PosthocError(f"--wiseft: {scored.run.path} started from no weights (model.init_from is null and "
                           "model.pretrained false): WiSE-FT interpolates between the weights a fine-tune started "
                           "from and its final ones")
    model = scored.run.model(scored.run.data())  # the head the run had (a folder's config leaves num_classes null)
    weights_classes = (getattr(model, "pretrained_cfg", None) or {}).get("num_classes")
    classes = getattr(model, "num_classes", weights_classes)
    if weights_classes and classes != weights_classes:
        raise PosthocError(f"--wiseft: {scored.run.path} started from pretrained weights with a head of "
                           f"{weights_classes} classes re-initialised at random for {classes}: its start is no "
                           "pretrained network (WiSE-FT needs the start's head trained, e.g. the weights' own)")
    source = str(file) if file else f"{scored.run.get('model.name')} (timm's pretrained weights)"
    return model.state_dict(), source


# -- scoring ----------------------------------------------------------------------------------------------------------
def model_of(scored: Scored, weights: State, source: str, recompute_bn: bool = True) -> torch.nn.Module:
    """The run's network with ``weights`` and its BatchNorm statistics recomputed over the run's training data
    (``recompute_bn=False``: those ``weights`` hold, e.g. WiSE-FT's interpolated statistics)."""
    model = scored.model_for(weights, source)
    if recompute_bn:
        scored.update_bn(model)
    return model


def val_score(scored: Scored, by: str) -> Callable[[State], float]:
    """Higher-is-better score of weights on the run's validation split: accuracy, or minus the NLL."""
    labels = labels_of(scored.val_loader)

    def score(weights: State) -> float:
        model = model_of(scored, weights, "a soup")
        m = metrics_from_log_probs(ModelPredictor(model, scored.device).predict_log_proba(scored.val_loader), labels)
        return m["acc"] if by == "acc" else -m["nll"]

    return score


def score(scored: Scored, label: str, weights: State, described: dict, recompute_bn: bool = True) -> dict:
    """``label``'s metrics (and ``label+ts``'s) as a run scores its predictors, with the predictions to write."""
    model = model_of(scored, weights, label, recompute_bn)
    val_loader = scored.val_loader
    evaluation = score_predictors({label: ModelPredictor(model, scored.device)}, scored.test_loader,
                                  scored.test_labels(), val_loader,
                                  labels_of(val_loader) if val_loader is not None else None, "auto",
                                  lambda name: dict(described))
    return {"metrics": evaluation.metrics, "evaluation": evaluation}


def folder_name(label: str) -> str:
    """A label as a folder name any shell takes unquoted: ``swa[12:16]`` -> ``swa_12-16``."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "", label.replace("[", "_").replace("(", "_").replace(":", "-"))


def write_result(run: Path, label: str, scored_out: dict) -> Path:
    """``<run>/posthoc/<name>/``: ``predictions.pt``, then ``metrics.json`` (whole or absent:
    ``swalab.rundir.write_record``; the run's own records untouched)."""
    folder = Path(run) / FOLDER / folder_name(label)
    evaluation = scored_out["evaluation"]
    write_record(folder, scored_out["metrics"],
                 {RunDir.PREDICTIONS: lambda path: save_predictions(evaluation.log_probs, evaluation.labels, path)})
    return folder


def files_read(run: Path, built_from: Sequence[str]) -> list[Path]:
    """The files on disk an average of ``run`` was built from (``built_from``'s names): its snapshots, its
    ``final.pt``, the ``final.pt`` of another run named by its directory (a soup's ingredients, WiSE-FT's start)."""
    out = []
    for name in built_from:
        for candidate in (Path(run) / RunDir.SNAPSHOTS / name, Path(run) / name, Path(name) / RunDir.FINAL):
            if candidate.is_file():
                out.append(candidate)
                break
    return out


def fingerprints(run: Path, files: Sequence[Path]) -> dict[str, str | None]:
    """``{path relative to run: swalab.rundir.file_fingerprint}`` of ``files``: what an average records of what it
    averaged, so that the report (``swalab.results.runs.Run.posthoc``) and a later call see when the run's files
    changed under it (the run trained again, more snapshots now)."""
    return {source_name(run, f): file_fingerprint(f) for f in files}


def source_name(run: Path, file: Path) -> str:
    """How an average's record names a file it read: its path relative to ``run`` (:func:`fingerprints`)."""
    return os.path.relpath(file, run)


def earlier_average(run: Path, label: str, rebuild: dict, read: Sequence[Path]) -> dict | None:
    """``label``'s record in ``<run>/posthoc/`` (``{label: metrics, label+ts: metrics}``) when an earlier call built it
    with the same options (``rebuild``: the record's ``rebuild`` and ``rebuild_runs``) from the same files: those
    ``read`` now, none of which changed since (``swalab.rundir.changed_files``); else None. A record is whole or
    absent (its ``metrics.json`` is written last), so one that reads back is whole."""
    record = read_json(Path(run) / FOLDER / folder_name(label) / RunDir.METRICS)
    mine = record.get(label) if isinstance(record, dict) else None
    sources = mine.get("sources") if isinstance(mine, dict) else None
    if not isinstance(sources, dict) or any(mine.get(k) != v for k, v in rebuild.items()):
        return None
    if set(sources) != {source_name(run, f) for f in read} or changed_files(run, sources):
        return None
    return record


# -- the requests -----------------------------------------------------------------------------------------------------
@dataclass
class Request:
    """What to build (the command line's options, checked by :func:`check_request`)."""

    swa: Sequence[str] = ()
    lawa: Sequence[int] = ()
    ema: Sequence[float] = ()
    powerema: Sequence[float] = ()
    soup: Sequence[str] = ()
    wiseft: Sequence[float] = ()
    wiseft_bn: Sequence[str] = ("recompute",)
    select: str | None = None
    by: str = "nll"
    again: bool = False


def check_request(request: Request, runs: Sequence[Scored]) -> None:
    """Refuse, before anything is built, what cannot be answered honestly: a choice on the test set, a soup of runs
    of other configs, a choice without a validation split."""
    if request.select == "test":
        raise PosthocError("--select test: an average chosen on the test set has a test score fitted to it; choose on "
                           "the validation split (--select val, runs with dataset.val_size)")
    if request.select not in (None, "val"):
        raise PosthocError(f"--select {request.select}: choose on val (the validation split)")
    if request.by not in ("nll", "acc"):
        raise PosthocError(f"--by {request.by}: rank by nll or acc")
    for kind in request.soup:
        if kind not in ("uniform", "greedy"):
            raise PosthocError(f"--soup {kind}: a soup is uniform or greedy")
    needs_val = ["--select val"] * (request.select == "val") + ["--soup greedy"] * ("greedy" in request.soup)
    for scored in runs:
        if needs_val and scored.val_loader is None:
            raise PosthocError(f"{needs_val[0]} chooses on the validation split, and {scored.run.path} has none: "
                               "train with dataset.val_size=<images or a fraction>")
    if request.soup:
        check_soup(request.soup[0], runs)
    for d in request.ema:
        check_decay(d)
    try:
        check_widths(request.powerema, key="--powerema")
    except ConfigError as e:
        raise PosthocError(str(e)) from None
    for a in request.wiseft:
        check_alpha(a)
    for mode in request.wiseft_bn:
        if mode not in WISEFT_BN:
            raise PosthocError(f"--wiseft-bn {mode}: recompute (BatchNorm statistics over the training data, as for "
                               "every average) or interpolate (the start's and the final statistics, interpolated "
                               "as the weights are)")
    for scored in runs:
        points = points_of(scored)
        asked = [*(f"--swa {w}" for w in request.swa), *(f"--lawa {k}" for k in request.lawa),
                 *(f"--ema {d:g}" for d in request.ema)]
        if asked:  # the first is named: every one of them averages the run's snapshots
            check_averaged(points, asked[0], scored.run.path, scored.run.get("run.snapshots"),
                           int(scored.run.get("trainer.epochs")))
        for w in request.swa:
            swa_window(points, w)
        for k in request.lawa:
            last_k(points, k)
        if request.wiseft:
            start_weights(scored)
        if request.powerema:
            check_powerema(scored, request.powerema)


def check_soup(kind: str, runs: Sequence[Scored]) -> None:
    """Refuse a soup (``--soup <kind>``) of fewer than 2 runs, of runs of other configs or of a seed given twice."""
    if len(runs) < 2:
        raise PosthocError(f"--soup {kind}: a soup needs the final weights of 2 runs at least; give the "
                           "run directories of one config's seeds")
    first = runs[0].run
    for other in runs[1:]:
        if group_hash(other.run.identity) != group_hash(first.identity):
            apart = [d for d in differences(first.identity, other.run.identity, ignore=("seed",))][:3]
            raise PosthocError(f"--soup: {other.run.path} is another config than {first.path} "
                               f"({'; '.join(apart)}): a soup here mixes the seeds of one config only")
    seen: dict[object, Path] = {}
    for scored in runs:  # one config: a seed given twice is one run counted as two ingredients
        if scored.run.seed in seen:
            raise PosthocError(f"--soup: {scored.run.path} and {seen[scored.run.seed]} are one run (seed "
                               f"{scored.run.seed}) given twice: give each seed's run directory once")
        seen[scored.run.seed] = scored.run.path


def per_run(scored: Scored, request: Request) -> Iterator[tuple]:
    """``(label, family, knob, weights, built from[, what metrics.json says of it])`` of every average of one run
    that ``request`` asks for, each once (``--lawa 2 2``, ``--swa 4:6 4:`` of a run of 6 epochs: one average)."""
    points = points_of(scored)
    windows: dict[str, tuple[str, list[Point]]] = {}
    for w in request.swa:
        label, inside = swa_window(points, w)
        windows.setdefault(label, (w, inside))
    for label, (w, inside) in windows.items():
        yield (label, "swa", inside[0].position, mean_of(p.read() for p in inside), [p.name for p in inside],
               {"rebuild": f"--swa {w}"})
    for k in dict.fromkeys(request.lawa):
        label, inside = last_k(points, k)
        yield (label, "lawa", float(k), mean_of(p.read() for p in inside), [p.name for p in inside],
               {"rebuild": f"--lawa {k}"})
    for d in dict.fromkeys(request.ema):
        yield (f"ema{d:g}", "ema", d, ema_of((p.read() for p in points), d), [p.name for p in points],
               {"rebuild": f"--ema {d:g}"})
    found = check_powerema(scored, request.powerema) if request.powerema else []
    for s in request.powerema:
        label, weights, built_from, info = power_ema(found, s)
        yield label, "powerema", s, weights, built_from, {"powerema": info, "rebuild": f"--powerema {s:g}"}
    if request.wiseft:
        (start, source), final = start_weights(scored), scored.run.weights("live")
        for mode in dict.fromkeys(request.wiseft_bn):
            family, suffix, bn = WISEFT_BN[mode]
            for a in dict.fromkeys(request.wiseft):
                yield (f"wiseft{a:g}{suffix}", family, a, interpolate(start, final, a), [source, RunDir.FINAL],
                       {"bn": bn, "rebuild": f"--wiseft {a:g} --wiseft-bn {mode}"})


def soup_order(runs: Sequence[Scored]) -> list[Scored]:
    """The runs of a soup by seed: the first is the soup's home (its ``posthoc/`` holds it, its data score it), so
    that one soup asked with its runs in another order is written once, in one place, not counted twice."""
    return sorted(runs, key=lambda r: (int(r.run.seed), str(r.run.path.resolve())))


def soups(runs: Sequence[Scored], request: Request) -> Iterator[tuple]:
    """The soups ``request`` asks for, from the final live weights of ``runs`` (in :func:`soup_order`; the first
    run's data score them), each with every run's ``final.pt`` as what it read (the greedy soup ranks them all)."""
    finals = [r.run.weights("live") for r in runs]
    names = [str(r.run.path) for r in runs]
    home = runs[0].run.path
    read = [r.run.path / RunDir.FINAL for r in runs]
    others = [os.path.relpath(r.run.path, home) for r in runs]  # the rebuilding command's runs, from its home
    if "uniform" in request.soup:
        yield (f"soup-uniform({len(runs)})", "soup", float(len(runs)), mean_of(finals), names,
               {"rebuild": "--soup uniform", "rebuild_runs": others}, read)
    if "greedy" in request.soup:
        ranked = "" if request.by == "nll" else f"[by-{request.by}]"  # one ranked otherwise is another soup
        label, rebuild = f"soup-greedy({len(runs)}){ranked}", {"rebuild": f"--soup greedy --by {request.by}",
                                                                  "rebuild_runs": others}
        if not request.again and earlier_average(home, label, rebuild, read) is not None:
            yield label, "soup", math.nan, None, [], rebuild, read  # kept (build_and_score): no ranking again
            return
        score_of = val_score(runs[0], request.by)
        order = sorted(range(len(runs)), key=lambda i: -score_of(finals[i]))
        soup, kept = greedy_soup([finals[i] for i in order], score_of)
        yield label, "soup", float(len(kept)), soup, [names[order[i]] for i in kept], rebuild, read


def build_and_score(run_dirs: Sequence[str | Path], request: Request, device: str = "auto") -> list[Result]:
    """Open every run, check the request, build every average, score and write it (module doc). A run given twice
    (under two spellings) is opened and averaged once; the soups' check still sees it twice and refuses it."""
    opened = {Path(d).resolve(): score_run(d, device=device) for d in each_once(run_dirs)}
    runs = [opened[Path(d).resolve()] for d in run_dirs]
    check_request(request, runs)
    results: list[Result] = []

    def add(scored: Scored, label: str, family: str, knob: float, weights: State, built_from: list[str],
            extra: dict | None = None, read: Sequence[Path] | None = None) -> None:
        run = scored.run.path
        read = files_read(run, built_from) if read is None else read
        rebuild = {"rebuild_runs": ["."], **{k: v for k, v in (extra or {}).items() if k.startswith("rebuild")}}
        earlier = None if request.again else earlier_average(run, label, rebuild, read)
        if earlier is not None:  # built before from the same files: the same average, scored the same
            m, path = earlier[label], run / FOLDER / folder_name(label)
            results.append(Result(label, family, float(m.get("knob", knob)), run, earlier,
                                  list(m.get("built_from") or []), path))
            print(f"[swalab.posthoc] {label:<18} kept, built before from the same files (--again builds it again) "
                  f"-> {path}")
            return
        described = {"posthoc": family, "knob": knob, "built_from": built_from,
                     "epoch": int(scored.run.get("trainer.epochs")), "rebuild_runs": ["."], **(extra or {}),
                     "sources": fingerprints(run, read)}
        out = score(scored, label, weights, described, recompute_bn=described.get("bn") != "interpolated")
        path = write_result(scored.run.path, label, out)
        results.append(Result(label, family, knob, scored.run.path, out["metrics"], built_from, path))
        m = out["metrics"][label]
        val = f", val acc {m['val']['acc']:.2f} nll {m['val']['nll']:.4f}" if "val" in m else ""
        print(f"[swalab.posthoc] {label:<18} test acc {m['acc']:.2f} nll {m['nll']:.4f}{val} -> {path}")

    for scored in opened.values():
        for item in per_run(scored, request):
            add(scored, *item)
    ordered = soup_order(runs) if request.soup else []
    for item in soups(ordered, request) if request.soup else ():
        add(ordered[0], *item)
    return results


def earlier_results(results: Sequence[Result]) -> list[Result]:
    """The averages earlier calls wrote to the ``posthoc/`` of the same runs, those not built again now and still
    current (built from the run's files as they are: ``swalab.results.runs.Run.posthoc``): the figure draws them
    beside this call's, and ``--select val`` compares those of the families built now with this call's (a sweep of
    EMA decays over two calls is one choice). The knob of one an earlier swalab wrote is not recorded: NaN."""
    from swalab.calibration import SUFFIX

    now = {(r.run, r.label) for r in results}
    out = []
    for run in dict.fromkeys(r.run for r in results):
        found = Run(run)
        for label, m in found.posthoc.items():
            if m.get("posthoc") and not label.endswith(SUFFIX) and (run, label) not in now:
                out.append(Result(label, str(m["posthoc"]), float(m.get("knob", math.nan)), run, {label: m},
                                  list(m.get("built_from") or []), found.posthoc_folders[label]))
    return out


def select(results: Sequence[Result], by: str) -> dict[tuple[Path, str], Result]:
    """Per run and family, the result best on the validation split by ``by`` (``nll``: lowest; ``acc``: highest)."""
    best: dict[tuple[Path, str], Result] = {}
    for r in results:
        val = r.metrics[r.label].get("val")
        if val is None:
            continue
        key = (r.run, r.family)
        better = (lambda a, b: a < b) if by == "nll" else (lambda a, b: a > b)
        if key not in best or better(val[by], best[key].metrics[best[key].label]["val"][by]):
            best[key] = r
    return best
