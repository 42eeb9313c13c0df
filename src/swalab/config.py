"""OmegaConf resolvers used by ``conf/`` and the checks that run before any training.

Resolvers (registered on import of ``swalab``):

* ``${swalab.epochs:BUDGET,B}``: ``round(BUDGET * B)`` epochs, e.g. 1.5 budgets of a 200-epoch
  model is 300 epochs;
* ``${swalab.run_path:DATASET,MODEL,METHOD,OVERRIDES,SEED,EXPERIMENT}``: the run directory below
  ``outputs/``. It depends only on what was asked for, so re-launching the same command lands in
  the same directory, where the run resumes (or is skipped when it already finished).

``check_config`` catches bad values before training starts and names the key and the allowed
range in its message.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def budget_epochs(budget: float, base: float) -> int:
    return int(round(float(budget) * float(base)))


def run_path(dataset: str, model: str, method: str, overrides: str, seed, experiment=None) -> str:
    """``[experiment/]dataset/model/method/<other overrides or 'default'>/seed<seed>``."""
    rest = re.sub(r"[^A-Za-z0-9=.,_+\-@]", "_", overrides or "") or "default"
    head = f"{experiment}/" if experiment not in (None, "", "None", "null") else ""
    return f"{head}{dataset}/{model}/{method}/{rest}/seed{seed}"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("swalab.epochs", budget_epochs, replace=True)
    OmegaConf.register_new_resolver("swalab.run_path", run_path, replace=True)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what is allowed."""


def _positive(cfg: DictConfig, key: str, errors: list[str], allow_zero: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"{key}={value!r} must be a number {'>= 0' if allow_zero else '> 0'}")
        return
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        errors.append(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}")


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` listing every bad value the config holds (not just the first)."""
    errors: list[str] = []
    for key in ("trainer.batch_size", "schedule.lr", "method.swa_lr", "method.swa_lr_min",
                "method.lr_max", "method.lr_min", "method.cycle", "method.budget", "model.budget"):
        _positive(cfg, key, errors)
    for key in ("trainer.epochs", "trainer.weight_decay", "trainer.momentum", "trainer.eval_every",
                "trainer.checkpoint_every"):  # trainer.epochs=0 scores the starting weights only
        _positive(cfg, key, errors, allow_zero=True)
    if cfg.trainer.get("keep_checkpoints", 2) < 1:
        errors.append(f"trainer.keep_checkpoints={cfg.trainer.keep_checkpoints} must be >= 1")
    if cfg.trainer.get("nonfinite", "stop") not in ("stop", "skip"):
        errors.append(f"trainer.nonfinite={cfg.trainer.nonfinite!r} must be 'stop' or 'skip'")
    if str(cfg.trainer.resume) not in ("auto", "True", "False", "true", "false") and not isinstance(
            cfg.trainer.resume, str):
        errors.append(f"trainer.resume={cfg.trainer.resume!r} must be auto, true, false or a run directory")
    fraction = cfg.trainer.get("bn_update_fraction", 1.0)
    if not 0 < fraction <= 1:
        errors.append(f"trainer.bn_update_fraction={fraction} must be in (0, 1]")
    train_size = cfg.dataset.get("train_size")
    if train_size is not None and train_size < 1:
        errors.append(f"dataset.train_size={train_size} must be >= 1 (or null for the whole training set)")
    batch_size = cfg.trainer.batch_size
    if isinstance(train_size, int) and isinstance(batch_size, int) and batch_size > train_size >= 1:
        errors.append(f"trainer.batch_size={batch_size} is larger than dataset.train_size={train_size}: "
                      "lower the batch size or raise the training set size")
    swa_start = OmegaConf.select(cfg, "method.swa_start")
    if swa_start is not None and isinstance(cfg.trainer.epochs, int) and cfg.trainer.epochs > 0 and not 0 <= swa_start < cfg.trainer.epochs:
        errors.append(f"method.swa_start={swa_start} must be in [0, trainer.epochs={cfg.trainer.epochs}): "
                      "SWA needs epochs after swa_start to average")
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def check_writable(run_dir: str | Path) -> None:
    """Fail at start, naming the directory and the overrides that move it, when outputs cannot be written.

    Creates ``run_dir`` and writes (then removes) one small file there, so a read-only mount, a
    missing permission or a full disk shows up before any data is loaded or any step trained.
    """
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir) as f:
            f.write(b"swalab write check")
    except OSError as exc:
        raise PermissionError(
            f"cannot write the run directory {run_dir} ({type(exc).__name__}: {exc.strerror or exc}). Point the "
            "outputs somewhere writable with paths.output_dir=<dir> (all runs) or hydra.run.dir=<dir> (this run)"
        ) from exc
