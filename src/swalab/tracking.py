"""Experiment tracking through W&B's own library, never at the cost of a run.

``history.jsonl`` and ``metrics.json`` in the run directory are the record; W&B is a mirror.
Every call into W&B is guarded: when W&B cannot be imported, cannot start (no network, bad
key) or fails mid-run, the run goes on, one warning says what was not logged, and later calls
become no-ops. ``mode="offline"`` (the default) writes to ``<run>/wandb`` for a later
``wandb sync``; ``mode="disabled"`` (tests, ``logger=none``) does nothing at all.

What a W&B run of swalab holds (``swalab.train`` computes the labels with :func:`run_labels`):

* a short name (``swa schedule-cosine seed0``: the method, the overrides that set the run apart,
  the seed), the group of its seeds (the identity minus the seed: ``digits-preresnet20-swa-1a2b3c4d``),
  the method as job type, and tags ``dataset:``, ``model:``, ``method:`` and ``grid:<date_time>``
  for each grid launch that ran it;
* the resolved config with the identity's hashes; every per-epoch metric against ``epoch``, with
  ``test_error`` beside each ``test_acc``; each predictor's final metrics as numbers in the summary
  (``swa/acc``); the reliability diagrams and FGE's members curve as tables with line charts.

One swalab run is one W&B run, however often it is preempted and resumed: the W&B run id is kept
in ``<run>/wandb_run.json`` (:data:`RECORD_FILE`), a resumed run continues that W&B run
(``resume="allow"``), and the epochs W&B already holds are not sent again.

An unreachable server costs at most ``init_timeout`` seconds: an ``online`` run that cannot
start within it is mirrored offline instead (``wandb sync`` uploads it later, into the same run)."""

from __future__ import annotations

import os
import secrets
import string
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swalab.rundir import RunDir, first_line, read_json

RECORD_FILE = RunDir.WANDB_RUN
MAX_NAME = 128  # characters W&B keeps of a run's name and group


class NullTracker:
    """Tracks nothing (``logger=none``)."""

    def __init__(self, **ignored: Any):
        pass

    def log(self, row: dict[str, Any], step: int | None = None) -> None:
        pass

    def log_epoch(self, row: dict[str, Any]) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def results(self, metrics: dict[str, Any], reliability: dict[str, list[dict]]) -> None:
        pass

    def log_artifact(self, path: str | Path, name: str, kind: str = "model") -> None:
        pass

    def final_checkpoint(self, path: str | Path) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


class WandbTracker(NullTracker):
    """A W&B run that degrades to doing nothing, with one warning, when W&B misbehaves.

    ``run_id`` continues that W&B run when it exists (a resumed swalab run); ``logged_through`` is
    the last epoch W&B already holds, so :meth:`log_epoch` skips what was sent before a preemption."""

    def __init__(self, project: str, run_dir: str | Path, run_config: dict, mode: str = "offline",
                 entity: str | None = None, group: str | None = None, tags: list[str] | None = None,
                 name: str | None = None, job_type: str | None = None, log_checkpoint: bool = False,
                 init_timeout: float = 30.0, run_id: str | None = None, logged_through: int = 0):
        self.run = None
        self._failed = False
        self.not_logged: list[str] = []
        self.log_checkpoint = log_checkpoint
        self.logged_through = int(logged_through)
        self.mode = mode
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            if mode == "online":
                # wandb reports its own errors to the same server; when that server does not answer, the
                # report holds the process up to 20 s at exit. WANDB_ERROR_REPORTING=true turns it back on.
                os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
            kwargs = {"project": project, "entity": entity, "group": group, "tags": list(tags or []) or None,
                      "name": name, "job_type": job_type, "config": run_config, "dir": str(run_dir), "id": run_id,
                      "resume": "allow" if run_id else None, "reinit": "finish_previous",
                      # quiet: the "logged in as" line asks the server outside init_timeout's bound
                      "settings": wandb.Settings(init_timeout=float(init_timeout), quiet=True)}
        except Exception as exc:  # import error
            self._fail("init", exc)
            return
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as exc:  # network, auth, timeout...
            if mode != "online":
                self._fail("init", exc)
                return
            try:
                wandb.teardown()  # the failed attempt still holds the run id in W&B's service process
                self.run = wandb.init(mode="offline", **kwargs)
            except Exception:
                self._fail("init", exc)
                return
            self.mode = "offline"
            warnings.warn(f"W&B could not start online ({first_line(exc)}) within "
                          f"logger.init_timeout={init_timeout:g} s; training goes on and this run is mirrored offline "
                          f"in {Path(run_dir) / 'wandb'}: `wandb sync {Path(run_dir) / 'wandb'}/offline-run-*` uploads "
                          "it later, into the same W&B run", RuntimeWarning, stacklevel=2)
        self.logged_through = max(self.logged_through, int(getattr(self.run, "starting_step", 0) or 0) - 1)

        def axes():
            self.run.define_metric("epoch")
            self.run.define_metric("*", step_metric="epoch")
        self._call("define_metric", axes)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.not_logged.append(what)
        if not self._failed:
            warnings.warn(f"W&B failed at {what} ({type(exc).__name__}: {exc}); training goes on and its metrics "
                          "are still written to history.jsonl and metrics.json, but are not sent to W&B",
                          RuntimeWarning, stacklevel=3)
        self._failed = True

    def _call(self, what: str, fn, *args, **kwargs) -> None:
        if self.run is None or self._failed:
            self.not_logged.append(what)
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            self._fail(what, exc)

    def log(self, row: dict[str, Any], step: int | None = None) -> None:
        self._call("log", lambda: self.run.log(row, step=step))

    def log_epoch(self, row: dict[str, Any]) -> None:
        """One history row at step ``epoch``, with ``test_error`` beside each ``test_acc``; skipped when W&B
        already holds that epoch (a resumed run)."""
        epoch = int(row["epoch"])
        if epoch <= self.logged_through:
            return
        self.log(with_test_error(row), step=epoch)
        self.logged_through = epoch

    def summary(self, metrics: dict[str, Any]) -> None:
        def write():
            for key, value in flatten(metrics).items():
                self.run.summary[key] = value
        self._call("summary", write)

    def results(self, metrics: dict[str, Any], reliability: dict[str, list[dict]]) -> None:
        """The end of a run: each predictor's metrics in the summary (``swa/acc``), the reliability diagrams
        (table ``reliability_table``) and each ensemble's members curve (table ``<predictor>/curve_table``)."""
        self.summary(metrics)

        def write():
            import wandb

            from swalab.evaluate import reported_metrics

            charts = {}
            rows = [[name, b["lo"], b["hi"], b["conf"], b["acc"], b["count"]]
                    for name, bins in reliability.items() for b in bins if b.get("count")]
            if rows:
                table = wandb.Table(columns=["predictor", "bin_lo", "bin_hi", "confidence", "accuracy", "count"],
                                    data=rows)
                charts["reliability"] = wandb.plot.line(table, x="confidence", y="accuracy", stroke="predictor",
                                                        title="Reliability: accuracy against confidence")
            for name, m in metrics.items():
                curve = m.get("curve") if isinstance(m, dict) else None
                if curve:
                    names = [metric.name for metric in reported_metrics()]
                    table = wandb.Table(columns=["members", *names],
                                        data=[[p["members"], *(p.get(n) for n in names)] for p in curve])
                    charts[f"{name}/curve"] = wandb.plot.line(table, x="members", y="acc",
                                                              title=f"{name}: test accuracy against members")
            if charts:
                self.run.log(charts)
        self._call("results", write)

    def log_artifact(self, path: str | Path, name: str, kind: str = "model") -> None:
        def write():
            import wandb
            artifact = wandb.Artifact(name, type=kind)
            artifact.add_file(str(path))
            self.run.log_artifact(artifact)
        self._call("artifact", write)

    def final_checkpoint(self, path: str | Path) -> None:
        """Upload ``final.pt`` as a model artifact when ``logger.log_checkpoint`` asks for it."""
        if self.log_checkpoint and self.run is not None:
            self.log_artifact(path, name=f"{self.run.id}-final", kind="model")

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            try:
                self.run.finish(exit_code=exit_code)
            except Exception as exc:
                self._fail("finish", exc)
            self.run = None


# -- what a W&B run of swalab is called ------------------------------------------------------------

def run_labels(dataset: str, model: str, method: str, seed: Any, apart: Sequence[str], group: str,
               grid: str | None = None) -> dict[str, Any]:
    """Name, group, job type and tags of the W&B run of one swalab run (module doc).

    ``apart``: what sets the run apart in its directory's name (``swalab.identity.name_items``:
    ``schedule-cosine``, ``trainer.epochs-6``); ``group``: the identity's group hash
    (``swalab.identity.group_hash``: every seed of one config shares it); ``grid``: the grid launch's
    record directory name (``<date_time>``), None for a single run. Names and groups longer than W&B
    keeps end in ``…`` after the last item that fits; the group hash keeps groups apart."""
    def fit(items: Sequence[str], room: int, sep: str) -> str:
        text = ""
        for item in items:
            if len(text) + len(sep) + len(item) + 1 > room:
                return text + sep + "…" if text else "…"
            text = f"{text}{sep}{item}" if text else item
        return text

    seed_text = f"seed{seed}"
    middle = fit(apart, MAX_NAME - len(method) - len(seed_text) - 2, " ")
    name = " ".join(p for p in (method, middle, seed_text) if p)
    head, tail = f"{dataset}-{model}-{method}", f"-{group[:8]}"
    middle = fit(apart, MAX_NAME - len(head) - len(tail) - 1, "+")
    tags = [f"dataset:{dataset}", f"model:{model}", f"method:{method}"]
    if grid:
        tags.append(f"grid:{grid}")
    return {"name": name, "group": head + (f"-{middle}" if middle else "") + tail, "job_type": method, "tags": tags}


def read_record(run_dir: str | Path) -> dict[str, Any] | None:
    """``<run_dir>/wandb_run.json``: the W&B run that mirrors this run (id, name, group, tags, project)."""
    record = read_json(Path(run_dir) / RECORD_FILE)
    return record if isinstance(record, dict) and record.get("id") else None


def new_run_id() -> str:
    """A W&B run id: 8 characters of ``[a-z0-9]``, as W&B makes its own."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def plan_record(run_dir: str | Path, labels: dict[str, Any], project: str, entity: str | None) -> dict[str, Any]:
    """What ``wandb_run.json`` will hold for this launch: the id it already holds (a resumed run) or a
    new one, ``labels``, and the grid tags of earlier launches too (a run requeued in another grid
    stays findable under each)."""
    old = read_record(run_dir) or {}
    tags = list(labels["tags"])
    tags += [t for t in old.get("tags", []) if t.startswith("grid:") and t not in tags]
    return {"id": old.get("id") or new_run_id(), "name": labels["name"], "group": labels["group"],
            "job_type": labels["job_type"], "tags": tags, "project": project, "entity": entity}


# -- rows and summaries ----------------------------------------------------------------------------

def with_test_error(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` plus ``<x>test_error = 100 - <x>test_acc`` for each test accuracy (the paper plots error), and
    ``<x>val_error`` for each validation accuracy (``run.eval_split=val``)."""
    out = dict(row)
    for key, value in row.items():
        for split in ("test", "val"):
            if key.endswith(f"{split}_acc") and isinstance(value, (int, float)):
                out[key[:-len(f"{split}_acc")] + f"{split}_error"] = 100.0 - float(value)
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"swa": {"acc": 1}}`` -> ``{"swa/acc": 1}``; lists are left out (they are curves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
    return out
