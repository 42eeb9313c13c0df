"""Train one run (``python run.py method=swa model=wrn28_10 dataset=cifar100``) or a grid (``-m``).

``python run.py --help`` lists the config groups; ``--cfg job`` prints the composed config.

* A config that cannot work (a bad value, missing data, a run directory holding another config, the
  same run already training in another process) is refused before training starts, in one line
  naming the cause, exit 2, and nothing is written (``SWALAB_TRACEBACK=1`` shows the traceback too).
* A run that fails while training records the error in its ``status.json``; a single run then exits 1,
  with the traceback unless the error says all there is to say (a NaN loss, a full disk).
* In a grid (``-m``) each job writes a record to the grid's directory (``swalab.grid``) and the grid
  goes on; at its end a summary lists every job, and the command exits 1 if any did not finish.
* A paused run writes a checkpoint at the step it is on: preempted (SIGTERM/SIGUSR1) it exits 75,
  interrupted (Ctrl-C) 130; re-launching the same command continues it. A paused grid prints its summary
  and stops.
"""

import os
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import swalab  # noqa: F401  (registers the config resolvers before Hydra composes)
from swalab.checkpoint import CheckpointError
from swalab.grid import close_grid, record_job
from swalab.runlock import RunLocked
from swalab.train import execute, message, one_line, prepare
from swalab.trainer import INTERRUPTED_EXIT_CODE, NonFiniteLossError, Preempted

# Errors during training whose message says all a user needs: shown as one line, without a traceback.
SELF_EXPLAINED = (NonFiniteLossError, OSError, CheckpointError)
REFUSED_EXIT_CODE = 2


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    overrides = list(hydra_cfg.overrides.task)
    job = int(hydra_cfg.job.num) if multirun else None
    run_dir = None
    if any(o.lstrip("+").startswith("hydra.run.dir=") for o in hydra_cfg.overrides.hydra):
        print("[swalab] hydra.run.dir does not place a run: swalab names run directories from the config. "
              "Use run.dir=<dir> to place this run, or paths.output_dir=<dir> for all of them", file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)

    def record(state: str, error: str | None = None) -> None:
        if multirun:
            record_job(hydra_cfg.sweep.dir, job, overrides, run_dir, state, error)

    def stop_grid(code: int) -> None:
        """A pause ends the whole command: a grid prints its summary (every job so far) before it exits."""
        if multirun:
            close_grid(hydra_cfg.sweep.dir, interrupted=True)
        sys.exit(code)

    record("running")
    plan = None
    try:
        plan = prepare(cfg, overrides=overrides, choices=dict(hydra_cfg.runtime.choices),
                       grid=hydra_cfg.sweep.dir if multirun else None)
        run_dir = plan.run_dir
        skipped = plan.finished is not None
        metrics = execute(plan)
    except Preempted as exc:
        record(exc.status, str(exc))
        print(f"[swalab] {exc}", file=sys.stderr)
        # A launcher that installed its own handler (submitit: SIGUSR1 -> checkpoint() -> requeue) gets the
        # signal now that the checkpoint is safely written; a plain launch exits 75 for a requeue wrapper.
        # Ctrl-C's own handler would only raise KeyboardInterrupt: the pause is complete without it.
        signum = exc.signum
        handler = signal.getsignal(signum) if signum and signum != signal.SIGINT else None
        if callable(handler):
            handler(signum, None)
        stop_grid(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before the run started training or while it was scored at the end
        record("interrupted", "KeyboardInterrupt: Ctrl-C")
        print("[swalab] interrupted (Ctrl-C): nothing of the run is lost; re-run the same command to continue",
              file=sys.stderr)
        stop_grid(INTERRUPTED_EXIT_CODE)
    except Exception as exc:
        refused = plan is None or not plan.started
        record("locked" if isinstance(exc, RunLocked) else "refused" if refused else "failed", one_line(exc))
        if multirun:
            print(f"[swalab] job {'did not run' if refused else 'failed'}, the grid goes on: {one_line(exc)}",
                  file=sys.stderr)
            return None
        if os.environ.get("SWALAB_TRACEBACK") or not (refused or isinstance(exc, SELF_EXPLAINED)):
            raise
        print(f"[swalab] {message(exc)}", file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE if refused else 1)
    record("skipped" if skipped else "complete")
    first = next((m for m in metrics.values() if "acc" in m), None)
    return None if first is None else first["acc"]



if __name__ == "__main__":
    from swalab.config import moved_keys

    moved = moved_keys(sys.argv[1:])  # before Hydra, which would say only that the key is not in the config
    if moved:
        print("[swalab] " + "; ".join(moved), file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)
    main()
