"""Experiment tracking through W&B's own library, never at the cost of a run.

``history.jsonl`` and ``metrics.json`` in the run directory are the record; W&B is a mirror.
Every call into W&B is guarded: when W&B cannot be imported, cannot start (no network, bad
key) or fails mid-run, the run goes on, one warning says what was not logged, and later calls
become no-ops. ``mode="offline"`` (the default) writes to ``<run>/wandb`` for a later
``wandb sync``; ``mode="disabled"`` (tests, ``logger=none``) does nothing at all.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any


class NullTracker:
    """Tracks nothing (``logger=none``)."""

    def __init__(self, **ignored: Any):
        pass

    def log(self, row: dict[str, Any], step: int | None = None) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def log_images(self, images: dict[str, str | Path]) -> None:
        pass

    def log_artifact(self, path: str | Path, name: str, kind: str = "model") -> None:
        pass

    def final_checkpoint(self, path: str | Path) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


class WandbTracker(NullTracker):
    """A W&B run that degrades to doing nothing, with one warning, when W&B misbehaves."""

    def __init__(self, project: str, run_dir: str | Path, run_config: dict, mode: str = "offline",
                 entity: str | None = None, group: str | None = None, tags: list[str] | None = None,
                 name: str | None = None, job_type: str | None = None, log_checkpoint: bool = False):
        self.run = None
        self._failed = False
        self.not_logged: list[str] = []
        self.log_checkpoint = log_checkpoint
        tags = [*(tags or []), *sweep_tags()]
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(project=project, entity=entity, group=group, tags=tags or None, name=name,
                                  job_type=job_type, config=run_config, dir=str(run_dir), mode=mode,
                                  reinit="finish_previous", settings=wandb.Settings(init_timeout=60))
        except Exception as exc:  # import error, network, auth...
            self._fail("init", exc)

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

    def summary(self, metrics: dict[str, Any]) -> None:
        def write():
            for key, value in flatten(metrics).items():
                self.run.summary[key] = value
        self._call("summary", write)

    def log_images(self, images: dict[str, str | Path]) -> None:
        def write():
            import wandb
            self.run.log({k: wandb.Image(str(v)) for k, v in images.items()})
        self._call("images", write)

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


def sweep_tags() -> list[str]:
    """``["sweep:<sweep dir name>"]`` for a job of a Hydra multirun (``-m``), else ``[]``.

    Runs of one grid share this tag, so W&B can filter a whole sweep; the W&B *group* stays the grid
    cell (dataset-model-method) so that W&B's grouped view averages over seeds, like the report's cells.
    """
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return [f"sweep:{Path(hydra_cfg.sweep.dir).name}"]
    except (ImportError, ValueError):  # no Hydra, or not inside a Hydra job (tests, notebooks)
        pass
    return []


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
