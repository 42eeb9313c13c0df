"""``train(cfg)``: the only place that reads the config.

A run goes through two steps, and nothing is written before the second:

1. ``plan.prepare`` checks everything that needs no data and finds the run's directory;
2. ``execute.execute`` locks it, loads the data, builds what trains (``build``), writes the run
   directory (``records``) and trains.

The run directory::

    config.yaml      the resolved config           identity.json  the run's identity and its hashes
    overrides.yaml   the command line's overrides  git.json       commit and dirty flag
    environment.json per start or resume of the run: time, commit, torch version, CPU threads, device
    history.jsonl    one line per epoch            metrics.json   final metrics per predictor
    status.json      running / failed / preempted / requeued / cancelled / interrupted (complete once
                     metrics.json is written), with the error line if any
    run.log          the run's log lines (one per epoch) with time stamps
    checkpoints/     epochNNNN.pt (last two kept while it trains, none once it has finished: final.pt holds
                     its weights); saved/ holds run.save_at epochs for good (docs/reliability.md)
    final.pt         live weights plus each method's own (SWA average, EMA)
    lineage.json     the checkpoint this run started from (model.init_from or run.branch_from), if any
    reliability.json per predictor, 15 confidence bins (count, accuracy, confidence) for reliability diagrams
    predictions.pt   per predictor, its test probabilities and log-probabilities (float16, when at most 5M
                     numbers) and the labels
    wandb_run.json   the W&B run that mirrors this run (logger=wandb): its id, name, group and tags
    wandb/           W&B's own files (offline-run-* for a later ``wandb sync``)

Re-running the same command lands in the same directory: a finished run is skipped, an
interrupted one resumes from its newest good checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from swalab.train.execute import TrainingFailed, execute
from swalab.train.plan import RunPlan, prepare, validate

__all__ = ["train", "prepare", "validate", "execute", "RunPlan", "TrainingFailed"]  # the builders: swalab.train.build


def train(cfg: DictConfig, run_dir: str | Path | None = None, overrides: Sequence[str] | None = None,
          choices: dict | None = None) -> dict:
    """Train one run as ``cfg`` says and return its final metrics (``{predictor: {metric: value}}``).

    ``run_dir`` places the run (default: ``run.dir``, else the name made from the config); see
    :func:`prepare` for ``overrides`` and ``choices``. Raises what stopped the run: a refusal, a pause, or the error
    that failed it once training had started (``execute`` wraps that one in :class:`TrainingFailed`)."""
    try:
        return execute(prepare(cfg, run_dir, overrides, choices))
    except TrainingFailed as failed:
        raise failed.__cause__ from None
