"""Train one run (``python run.py method=swa model=wrn28_10 dataset=cifar100``) or a grid (``-m``).

``python run.py --help`` lists the config groups; ``--cfg job`` prints the composed config.

* A config that cannot work (a bad value, missing data, a run directory holding another config, the
  same run already training in another process) is refused before training starts, in one line
  naming the cause, exit 2, and nothing is written (``SWALAB_TRACEBACK=1`` shows the traceback too).
* A run that fails while training records the error in its ``status.json``; a single run then exits 1,
  with the traceback unless the error says all there is to say (a NaN loss, a full disk).
* In a grid (``-m``) each job writes a record to the grid's directory (``swalab.grid``) and the grid
  goes on; at its end a summary lists every job, and the command exits 1 if any did not finish.
* A run stopped by a signal (``swalab.trainer.STOP_SIGNALS``: SIGTERM, SIGUSR1, SIGUSR2) writes a checkpoint,
  records why in ``status.json`` (``preempted``; under SLURM ``requeued`` or ``cancelled``, ``swalab.slurm``)
  and exits 75; re-launching the same command continues it. Under submitit (``hydra/launcher=slurm``) its
  handler then requeues the job, and a cancelled job ends normally so that the grid's summary can list it.
"""

import os
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import swalab  # noqa: F401  (registers the config resolvers before Hydra composes)
from swalab import distributed
from swalab.checkpoint import CheckpointError
from swalab.grid import record_job
from swalab.runlock import RunLocked
from swalab.train import execute, message, one_line, prepare
from swalab.train.records import write_status
from swalab.trainer import NonFiniteLossError, Preempted

# Errors during training whose message says all a user needs: shown as one line, without a traceback.
SELF_EXPLAINED = (NonFiniteLossError, OSError, CheckpointError)
REFUSED_EXIT_CODE = 2
SUBMITIT_JOB = "SUBMITIT_FOLDER"  # set in the process of a submitit job: one grid job per process


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
        if multirun and distributed.is_main():  # a job of several processes: rank 0 keeps the record
            record_job(hydra_cfg.sweep.dir, job, overrides, run_dir, state, error)

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
        print(f"[swalab] {exc.status}: {exc}", file=sys.stderr)
        try:
            hand_on(exc)
        except Exception as err:  # submitit declined to requeue (e.g. "timed-out too many times")
            exc.status = "preempted"
            write_status(run_dir, {"status": exc.status, "message": f"{exc}; not requeued: {one_line(err)}"})
            record(exc.status, f"not requeued: {one_line(err)}")
            print(f"[swalab] not requeued: {one_line(err)}; re-launch the same command to continue", file=sys.stderr)
        if multirun and SUBMITIT_JOB in os.environ and exc.status != "requeued":
            return None  # this process is one job, which will not come back: it ends, and the grid's summary says why
        sys.exit(exc.exit_code)
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


def hand_on(exc: Preempted) -> None:
    """Give the signal to the launcher's own handler, now that the checkpoint is written: submitit's
    (``hydra/launcher=slurm``) checkpoints the Hydra job and requeues it, then exits the process. A plain
    launch has none and exits 75 (EX_TEMPFAIL) for a requeue wrapper."""
    handler = signal.getsignal(exc.signum) if exc.signum else None
    if callable(handler) and handler is not signal.default_int_handler:  # Python's own SIGINT handler raises
        handler(exc.signum, None)


if __name__ == "__main__":
    main()
