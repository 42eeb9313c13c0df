"""A run directory read back: its files for reports, its data, network and weights for scoring again.

Reports, comparisons and analyses all start from a run directory. :class:`Run` is the one place that
knows its files: the resolved config, identity, status, metrics, history, reliability bins, lineage
(read lazily, each at most once, a missing or damaged file read as empty, so a report over a tree of
runs in any state never stops), and, for scoring again, the network with its SWA / EMA / live weights
and the data it was trained and tested on, rebuilt exactly as ``swalab.train`` builds them (the same
loader, ``build_model`` and ``build_loaders``), so a model is scored with the normalisation it was
trained with.

    run = open_run("outputs/cifar10/preresnet20/swa/default/seed0")
    run.metrics["swa"]["acc"], run.status, run.identity   # what the run wrote
    data = run.data()                                    # the run's ImageData (optionally capped)
    model = run.model(data)                              # a fresh network of the run's architecture
    model.load_state_dict(run.weights("swa"))            # the SWA average, BN statistics as they were scored
    swalab.runweights.load_weights("<run dir>@30")       # or any weight spec"""

from __future__ import annotations

import dataclasses
import os
from functools import cached_property
from pathlib import Path
from typing import Iterable

import torch
from omegaconf import DictConfig, OmegaConf

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.checkpoint import CheckpointStore, read_torch_file
from swalab.compat import upgraded_config
from swalab.config import ConfigError, build
from swalab.data import ImageData, subset
from swalab.data.classes import ClassesError, keep_classes, other_classes
from swalab.data.fingerprint import changes
from swalab.data.splits import DataSplit, cap_test_split
from swalab.identity import DATA_FINGERPRINT, counted, identity_of, method_class_of, stored_identity
from swalab.methods.fge import MEMBER_PROBS_FILE, member_log_probs_of
from swalab.train.build import build_loaders, build_model
from swalab.runlock import gone_holder
from swalab.runstatus import RunStatus
from swalab.rundir import DamagedRecord, RunDir, changed_files, read_json
from swalab.runweights import final_weights

class Run:
    """One run directory (see the module doc). Build it with :func:`open_run` to score it again, or
    ``Run(path)`` to read whatever it holds (reports)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- what the run wrote -------------------------------------------------------------------------
    @cached_property
    def config(self) -> dict:
        """The resolved config as a plain dict (empty when ``config.yaml`` is missing or damaged)."""
        loaded = RunDir(self.path).config()
        return {} if loaded is None else upgraded_config(loaded)

    @cached_property
    def cfg(self) -> DictConfig:
        return OmegaConf.create(self.config)

    def get(self, key: str, default=None):
        """A dotted key of the config (``trainer.epochs``), or ``default``."""
        node = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @cached_property
    def identity(self) -> dict:
        return stored_identity(self.path) or identity_of(self.config)

    @cached_property
    def apart(self) -> dict | None:
        """What sets the run apart from its defaults, in the keys a user types (``identity.json``'s ``apart``,
        ``swalab.identity.settings_apart``) under today's rules (without what only says what a run keeps, which an
        earlier swalab recorded: ``swalab.identity.counted``); None for a run that has no record of it (earlier
        versions)."""
        record = read_json(self.path / RunDir.IDENTITY) or {}
        apart = record.get("apart")
        return counted(apart) if isinstance(apart, dict) else None

    @cached_property
    def experiment(self) -> str | None:
        """The ``experiment=`` the run was launched with (its ``overrides.yaml``), or None. An experiment's own
        settings are its defaults, so :attr:`apart` leaves them out; a report's row names the experiment instead."""
        try:
            typed = OmegaConf.load(self.path / RunDir.OVERRIDES)
        except (OSError, ValueError):
            return None
        for item in typed if OmegaConf.is_list(typed) else ():
            key, _, value = str(item).lstrip("+").partition("=")
            if key == "experiment" and value:
                return value
        return None

    @cached_property
    def _status(self) -> dict:
        return read_json(self.path / RunDir.STATUS) or {}

    @cached_property
    def _final(self) -> tuple[dict, str | None]:
        """``metrics.json`` read back (``RunDir.final_metrics``) and what is wrong with it, if anything."""
        try:
            return RunDir(self.path).final_metrics() or {}, None
        except DamagedRecord as exc:
            return {}, str(exc)

    @property
    def status(self) -> str:
        """``complete`` exactly when ``metrics.json`` reads back (the one record of a finished run); else what
        ``status.json`` says (running, failed, preempted, interrupted), or that ``metrics.json`` is damaged."""
        if self.metrics:
            return RunStatus.COMPLETE
        if self._final[1] is not None:
            return RunStatus.DAMAGED
        status = self._status.get("status") or RunStatus.NONE
        if status == RunStatus.RUNNING and self._gone is not None:
            return RunStatus.STOPPED
        return RunStatus.INCOMPLETE if status == RunStatus.COMPLETE else status

    @cached_property
    def _gone(self) -> str | None:
        """Why no process trains this run although ``status.json`` says running (``swalab.runlock.gone_holder``)."""
        return gone_holder(self.path) if self._status.get("status") == RunStatus.RUNNING else None

    @property
    def error(self) -> str | None:
        damaged = self._final[1]
        if damaged is not None:
            if CheckpointStore(self.path).paths():
                return f"{damaged}: re-run the run's command to score it again from its last checkpoint"
            return (f"{damaged}: the run kept no checkpoint once it finished (run.keep_finished_checkpoints=false), so "
                    "re-running its command trains it again from the start")
        if self.status == RunStatus.STOPPED:
            return (f"status.json says running, but no process trains it ({self._gone}): re-run its command to "
                    "continue from its newest checkpoint")
        return self._status.get("error")

    @property
    def metrics(self) -> dict:
        return self._final[0]

    @property
    def finished(self) -> bool:
        return bool(self.metrics)

    @cached_property
    def history(self) -> list[dict]:
        """``history.jsonl``, one dict per epoch (``RunDir.history``)."""
        return RunDir(self.path).history()

    @cached_property
    def posthoc(self) -> dict[str, dict]:
        """Predictors built after training (``python -m swalab.posthoc``): ``{label: metrics}`` of every
        ``posthoc/*/metrics.json`` (``swa[12:16]``, ``lawa5``, ``ema0.9``, their ``+ts``), a damaged one skipped, and
        one built from files of the run that changed since (:attr:`posthoc_changed`) left out: it is no average of
        the run as it is."""
        return {label: m for folder, by_label in self._posthoc_records.items() if folder not in self.posthoc_changed
                for label, m in by_label.items()}

    @cached_property
    def posthoc_folders(self) -> dict[str, Path]:
        """``{label: folder}`` of :attr:`posthoc`: where each one's ``predictions.pt`` lies (ensembles of seeds)."""
        return {label: folder for folder, by_label in self._posthoc_records.items() if folder not in self.posthoc_changed
                for label in by_label}

    @cached_property
    def posthoc_changed(self) -> dict[Path, list[str]]:
        """``{folder: files}`` of the post-hoc averages whose files (snapshots, ``final.pt``, a soup's other runs'
        ``final.pt``; ``sources`` in its ``metrics.json``) hold other weights now than when it was built (the run
        trained again, a snapshot rewritten): ``swalab.rundir.changed_files``. A file that is gone says nothing, as
        for :meth:`score_notes`: snapshots removed to save disk once the averages are built leave them in the report
        (training again rewrites ``final.pt``, which is checked whenever it is there)."""
        out = {}
        for folder, by_label in self._posthoc_records.items():
            sources = next((m["sources"] for m in by_label.values() if isinstance(m.get("sources"), dict)), None)
            changed = changed_files(self.path, sources) if sources is not None else []
            if changed:
                out[folder] = changed
        return out

    def posthoc_notes(self) -> list[str]:
        """One line per post-hoc average that is no average of the run as it is (left out of :attr:`posthoc`),
        naming it, the files that changed and the command that builds it again; and one naming those an earlier
        swalab wrote without recording what they averaged (kept, but unchecked)."""
        notes = []
        for folder, changed in self.posthoc_changed.items():
            record = next(iter(self._posthoc_records[folder].values()))
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            notes.append(f"stale: {folder}: built from files of the run that changed since ({shown}), left out; "
                         f"build it again with {self._rebuild_command(record)}")
        unchecked = sorted(folder.name for folder, by_label in self._posthoc_records.items()
                           if not any(isinstance(m.get("sources"), dict) for m in by_label.values()))
        if unchecked:
            notes.append(f"unchecked: {self.path / RunDir.POSTHOC}: {', '.join(unchecked)} recorded no fingerprints of "
                         "the files they averaged (an earlier swalab), so a run trained again since cannot be told; "
                         "build them again with python -m swalab.posthoc to check them")
        return notes

    def _rebuild_command(self, record: dict) -> str:
        runs = [os.path.normpath(self.path / r) for r in record.get("rebuild_runs") or ["."]]
        return f"python -m swalab.posthoc {' '.join(runs)} {record.get('rebuild', '<the options it was built with>')}"

    @cached_property
    def _posthoc_records(self) -> dict[Path, dict[str, dict]]:
        out: dict[Path, dict[str, dict]] = {}
        for path in sorted((self.path / RunDir.POSTHOC).glob(f"*/{RunDir.METRICS}")):
            found = read_json(path)
            if isinstance(found, dict):
                out[path.parent] = {k: v for k, v in found.items() if isinstance(v, dict)}
        return out

    @cached_property
    def scores(self) -> dict[str, dict]:
        """The run scored again on other data (``python -m swalab.results.score``): ``{set name: record}`` of every
        ``scores/*/metrics.json`` (a test set's acc, NLL, ECE, Brier per predictor; an OOD set's AUROC, AUPR, FPR95),
        a damaged one skipped, and one scored from files of the run that changed since left out (:meth:`score_notes`):
        its numbers are of other weights than the run's."""
        return {name: record for name, record, changed in self._score_records() if not changed}

    def score_notes(self) -> list[str]:
        """One line per record of ``scores/`` scored from files of the run that hold other weights now (its
        ``inputs``, ``swalab.results.score.scoring_inputs``: the run trained again), naming the command that scores it
        again. A file that is gone says nothing: the records of a run kept without its weights (an archive of records,
        the checkpoints cleaned after scoring) stay in the report."""
        return [f"stale: {self.path / RunDir.SCORES / name}: scored from files of the run that changed since "
                f"({', '.join(changed[:3])}), left out; score it again with python -m swalab.results.score {self.path} "
                f"{'--ood' if 'positive' in record else '--data'} {(record.get('data') or {}).get('spec', '<spec>')}"
                for name, record, changed in self._score_records() if changed]

    def _score_records(self) -> list[tuple[str, dict, list[str]]]:
        """``(set name, record, files of the run changed since)`` of every whole ``scores/*/metrics.json``."""
        out = []
        for path in sorted((self.path / RunDir.SCORES).glob(f"*/{RunDir.METRICS}")):
            found = read_json(path)
            if isinstance(found, dict) and isinstance(found.get("predictors"), dict):
                files = (found.get("inputs") or {}).get("files")  # none in a record of an earlier swalab
                changed = changed_files(self.path, files) if isinstance(files, dict) else []
                out.append((path.parent.name, found, changed))
        return out

    @cached_property
    def reliability(self) -> dict:
        return read_json(self.path / RunDir.RELIABILITY) or {}

    @cached_property
    def lineage(self) -> dict | None:
        return read_json(self.path / RunDir.LINEAGE)

    @property
    def dataset_name(self) -> str:
        return str(self.get("dataset.name", "?"))

    @property
    def model_name(self) -> str:
        return str(self.get("model.name", "?"))

    @property
    def method(self) -> str:
        return str(self.get("method.name", "?"))

    @cached_property
    def method_class(self) -> type | None:
        """The run's method class (``swalab.identity.method_class_of``; a config that names none: the built-in method
        of its name); None: read by its name alone."""
        from swalab.methods import REPORT_ORDER

        if self.get("method._target_") is None:
            return next((method for method in REPORT_ORDER if method.name == self.method), None)
        return method_class_of(self.config)

    @property
    def live(self) -> str | None:
        """The name of the predictor of the run's live weights, as its method declares it (``Method.live``: ``sgd``,
        ``map`` of a Laplace run, ``pretrained``; None for FGE); ``sgd`` for a method class not importable here."""
        return getattr(self.method_class, "live", "sgd")

    @property
    def seed(self):
        return self.get("seed")

    @property
    def label(self) -> str:
        """A short name for tables: ``<method>/seed<seed>``."""
        return f"{self.method}/seed{self.seed}"

    # -- scoring it again ----------------------------------------------------------------------------
    @property
    def weight_decay(self) -> float:
        """The L2 coefficient the run trained with (the paper's train loss adds wd/2 ||w||^2)."""
        return float(self.cfg.optimizer.weight_decay)

    @cached_property
    def _whole_data(self) -> ImageData:
        """The run's data set as it trained on it, read once: scoring a run on 75 corrupted sets asks for it twice a set,
        and each read lists and fingerprints the data folder (about a second on 60,000 files). Refused when its files
        changed since the run was made (an image added or rewritten): scored on them, it would be scored on other data
        than its own under its own names (``test``), as ``run.py`` refuses to resume or skip it."""
        return keep_classes(self._own_data, self.get("dataset.classes"))

    @cached_property
    def _own_data(self) -> ImageData:
        try:
            data, then = build(self.cfg.dataset.source, "dataset.source"), self.identity.get(DATA_FINGERPRINT)
        except FileNotFoundError as exc:  # data moved, or a run made on another machine
            raise FileNotFoundError(f"{self.path}: its data is not at dataset.root={self.get('dataset.root')} "
                                    f"({str(exc).strip().splitlines()[0]}): put it back there, or write where it is "
                                    f"now as dataset.root in {self.path / RunDir.CONFIG}") from None
        record = getattr(data, "record", None)
        if then is not None and record is not None and record["fingerprint"] != then:
            what = changes((read_json(self.path / RunDir.DATA) or {}).get("record") or {}, record)
            where = self.get("dataset.root") or self.dataset_name
            raise ConfigError(f"{self.path} was made on other data than {where} holds now ({what}): restore the "
                              "images it was made on, or train a new run on these")
        return data

    def data(self, train_size: int | None = None, test_size: int | None = None, seed: int = 0) -> ImageData:
        """The run's data set, optionally cut to a seeded class-stratified training subset and a capped test set
        (seed 0, as ``dataset.test_size`` caps it), for analyses that cannot afford the whole splits. Read once per
        ``Run`` (its splits are shared: derive new ones, never change them in place)."""
        data = self._whole_data
        try:  # the analyses' flags, named as typed
            train = data.train if train_size is None else subset(data.train, train_size, seed, "--train-size")
            test = cap_test_split(data.test, test_size, "--test-size")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return dataclasses.replace(data, train=train, test=test)

    def other_classes_test(self) -> DataSplit:
        """The test images of the classes the run did not train on (``dataset.classes``): its split-class OOD set."""
        classes = self.get("dataset.classes")
        if not classes:
            raise ClassesError(f"{self.path} trained on every class (dataset.classes is not set): it has no "
                               "other classes; train with e.g. dataset.classes=[0,1,2,3,4]")
        return other_classes(self._own_data, classes)

    def model(self, data: ImageData | None = None) -> torch.nn.Module:
        """A fresh network of the run's architecture (built for ``data``'s classes and channels)."""
        return build_model(self.cfg, data)

    def loaders(self, data: ImageData, device: torch.device, **trainer: object):
        """The run's training, test and BN-update loaders on ``device`` (``trainer`` overrides trainer keys)."""
        cfg = OmegaConf.merge(self.cfg, {"trainer": trainer}) if trainer else self.cfg
        return build_loaders(cfg, data, device)

    def weights(self, name: str = "live") -> dict[str, torch.Tensor]:
        """A state dict of the finished run from ``final.pt`` (:func:`swalab.runweights.final_weights`)."""
        return final_weights(self.path, name, self.method)

    def method_weights(self) -> list[str]:
        """The names of the method's own weights in ``final.pt`` (``["swa"]``, ``["ema"]`` or none)."""
        final = self.path / RunDir.FINAL
        return sorted(read_torch_file(final).get("methods") or {}) if final.exists() else []

    def member_paths(self) -> list[Path]:
        """FGE members saved with ``model.fge.save_members=true``, in the order they were collected."""
        return sorted((self.path / RunDir.MEMBERS).glob("member_*.pt"))

    def cached_member_log_probs(self) -> list[torch.Tensor] | None:
        """The FGE members' test log-probabilities cached at the end of training (None when absent)."""
        path = self.path / MEMBER_PROBS_FILE
        if not path.exists():
            return None
        return member_log_probs_of(read_torch_file(path), path)


def open_run(run_dir: str | Path) -> Run:
    """A run directory to score again: it must hold its ``config.yaml``."""
    run_dir = Path(run_dir)
    if not (run_dir / RunDir.CONFIG).exists():
        below = [p for p in run_dirs([run_dir]) if p != run_dir] if run_dir.is_dir() else []  # an outputs folder
        why = ("it is a file; give the folder of a run" if run_dir.is_file() else
               "no such directory" if not run_dir.is_dir() else "no config.yaml there" if not below else
               f"it holds runs below it: give one of them, e.g. {below[0]}")
        raise FileNotFoundError(f"{run_dir} is not a swalab run directory: {why}")
    return Run(run_dir)


def run_dirs(roots: Iterable[str | Path]) -> list[Path]:
    """Every run directory below ``roots`` (a folder with ``config.yaml``, ``status.json`` or
    ``identity.json``); a grid record (``jobs/*.json``) names its runs itself."""
    from swalab.grid import read_jobs

    found: set[Path] = set()
    for root in map(Path, roots):
        for job in read_jobs(root):
            if job.get("run_dir"):
                found.add(Path(job["run_dir"]))
        for marker in (RunDir.CONFIG, RunDir.STATUS, RunDir.IDENTITY):
            for hit in root.rglob(marker):
                if RunDir.WANDB in hit.parent.parts:
                    continue
                found.add(hit.parent)
    return sorted(p for p in found if p.exists())


