"""Train one run (``python run.py method=swa model=wrn28_10 dataset=cifar100``) or a grid (``-m``).

``python run.py --help`` lists the config groups; ``--cfg job`` prints the composed config.

* A config that cannot work (a bad value, missing data, a run directory holding another config, the
  same run already training in another process) is refused before training starts, in one line
  naming the cause, exit 2, and nothing is written (``SWALAB_TRACEBACK=1`` shows the traceback too).
* A run that fails while training records the error in its ``status.json``; a single run then exits 1,
  with the traceback unless the error says all there is to say (a NaN loss, a full disk).
* In a grid (``-m``) a job's error is printed in full, as a single run prints it (the resolved path of
  missing data); each job writes a record to the grid's directory (``swalab.grid``) and the grid
  goes on; at its end a summary lists every job, and the command exits 1 if any did not finish.
* A paused run writes a checkpoint at the step it is on: preempted (SIGTERM/SIGUSR1/SIGUSR2) it exits 75,
  interrupted (Ctrl-C) 130; re-launching the same command continues it. Outside the training steps (loading, the
  final scoring) Ctrl-C and SIGTERM keep the newest checkpoint and exit 130 / 143. A paused grid prints its summary
  and stops. Under SLURM ``status.json`` says ``requeued`` or ``cancelled`` where SLURM says so
  (``swalab.slurm``); with ``hydra/launcher=slurm`` submitit's handler then requeues the job, and a job that
  will not come back ends normally so that the grid's summary lists it.
"""

import contextlib
import os
import signal
import sys


def interrupted_while_starting(signum, frame):
    """Ctrl-C while the imports below load (seconds on a busy machine): one line, not an import's traceback."""
    print("[swalab] interrupted (Ctrl-C) while starting: nothing was written", file=sys.stderr, flush=True)
    os._exit(130)  # pausing.INTERRUPTED_EXIT_CODE, not imported yet; SystemExit, like KeyboardInterrupt, may be
    # caught by an import's bare ``except:`` (numpy's then fails to load twice), and the run would go on


# (a process started with SIGINT ignored, as a shell's background job is, keeps ignoring it)
STARTED_WITH = signal.signal(signal.SIGINT, interrupted_while_starting)
if STARTED_WITH != signal.default_int_handler:
    signal.signal(signal.SIGINT, STARTED_WITH)

import hydra  # noqa: E402  (every import below may take seconds)
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import swalab  # noqa: F401  (registers the config resolvers before Hydra composes)
from swalab import distributed
from swalab.checkpoint import CheckpointError
from swalab.cli import Terminated, sigterm_raises
from swalab.grid import close_grid, record_job
from swalab.runlock import RunLocked
from swalab.runstatus import RunStatus
from swalab.train import TrainingFailed, execute, prepare
from swalab.train.execute import FoundFinished
from swalab.train.records import message, one_line
from swalab.rundir import RunDir
from swalab.pausing import INTERRUPTED_EXIT_CODE, Preempted
from swalab.step import NonFiniteLossError

signal.signal(signal.SIGINT, STARTED_WITH)  # started: Ctrl-C pauses a run (swalab.pausing) from here

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

    def stop_grid(code: int) -> None:
        """A pause ends the whole command: a grid prints its summary (every job so far) before it exits."""
        if multirun:
            close_grid(hydra_cfg.sweep.dir, interrupted=True)
        sys.exit(code)

    record(RunStatus.RUNNING)
    # SIGTERM outside the training steps (the final scoring) ends as Ctrl-C there does; a launcher's handler stays
    own_term = signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)
    try:
        with sigterm_raises() if own_term else contextlib.nullcontext():
            plan = prepare(cfg, overrides=overrides, choices=dict(hydra_cfg.runtime.choices),
                           grid=hydra_cfg.sweep.dir if multirun else None)
            run_dir = plan.run_dir
            metrics = execute(plan)
    except Preempted as exc:
        record(exc.status, str(exc))
        print(f"[swalab] {exc}", file=sys.stderr)
        try:
            hand_on(exc)
        except Exception as err:  # submitit declined to requeue (e.g. "timed-out too many times")
            exc.status = RunStatus.PREEMPTED
            RunDir(run_dir).write_status({"status": exc.status, "message": f"{exc}; not requeued: {one_line(err)}"})
            record(exc.status, f"not requeued: {one_line(err)}")
            print(f"[swalab] not requeued: {one_line(err)}; re-run the same command to continue", file=sys.stderr)
        if multirun and SUBMITIT_JOB in os.environ:  # this process is one job of the grid, which goes on
            if exc.status == RunStatus.REQUEUED:
                sys.exit(exc.exit_code)  # the job comes back and resumes
            return None  # the job will not come back: it ends here, and the grid's summary says why
        stop_grid(exc.exit_code)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM before the run started training or while it was scored
        term = isinstance(exc, Terminated)
        record(RunStatus.INTERRUPTED, "SIGTERM" if term else "KeyboardInterrupt: Ctrl-C")
        print(f"[swalab] {'stopped by SIGTERM' if term else 'interrupted (Ctrl-C)'}: nothing of the run is lost; "
              "re-run the same command to continue", file=sys.stderr)
        stop_grid(Terminated.exit_code if term else INTERRUPTED_EXIT_CODE)
    except TrainingFailed as failed:  # training had started: status.json records the error
        exc = failed.__cause__
        record(RunStatus.FAILED, one_line(exc))
        if multirun:
            print(f"[swalab] job failed, the grid goes on: {type(exc).__name__}: {message(exc)}", file=sys.stderr)
            return None
        if os.environ.get("SWALAB_TRACEBACK") or not isinstance(exc, SELF_EXPLAINED):
            raise exc from None
        print(f"[swalab] {message(exc)}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # refused before anything was written
        record(RunStatus.LOCKED if isinstance(exc, RunLocked) else RunStatus.REFUSED, one_line(exc))
        if multirun:
            print(f"[swalab] job did not run, the grid goes on: {message(exc)}", file=sys.stderr)
            return None
        if os.environ.get("SWALAB_TRACEBACK"):
            raise
        print(f"[swalab] {message(exc)}", file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)
    record(RunStatus.SKIPPED if isinstance(metrics, FoundFinished) else RunStatus.COMPLETE)
    first = next((m for m in metrics.values() if "acc" in m), None)
    return None if first is None else first["acc"]


def hand_on(exc: Preempted) -> None:
    """Give the signal to the launcher's own handler, now that the checkpoint is written: submitit's
    (``hydra/launcher=slurm``) checkpoints the Hydra job and requeues it, then exits the process. A plain
    launch has none and exits 75 (EX_TEMPFAIL) for a requeue wrapper; Ctrl-C's own handler would only raise
    KeyboardInterrupt: the pause is complete without it."""
    handler = signal.getsignal(exc.signum) if exc.signum and exc.signum != signal.SIGINT else None
    if callable(handler):
        handler(exc.signum, None)


def composing_refusals_in_one_line() -> None:
    """Run :func:`main`; what Hydra refuses while it composes the command line's config (a misspelt key, an unknown
    option of a group, an override it cannot parse) is said in one line, exit 2, as every other refusal, instead of
    Hydra's several lines and exit 1. Hydra's own report stays with ``HYDRA_FULL_ERROR=1`` or ``SWALAB_TRACEBACK=1``."""
    from hydra.errors import CompactHydraException

    from swalab.cli import one_line as in_one_line
    from swalab.config import unknown_key

    own_report = os.environ.get("HYDRA_FULL_ERROR") or os.environ.get("SWALAB_TRACEBACK")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises what it refuses, here, instead of printing it and exiting 1
    try:
        main()
    except CompactHydraException as exc:
        if own_report:
            raise
        typed = getattr(exc, "override", None)  # an override Hydra cannot parse
        print(f"[swalab] {unknown_key(exc) or (typed + ': ' if typed else '') + in_one_line(str(exc))}", file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)
    except ValueError as exc:  # Hydra's check of its modes (-m with --cfg), before any job; a run's errors pass on
        if own_report or not str(exc).startswith("Only one of --run, --multirun, --cfg"):
            raise
        print(f"[swalab] {exc}: drop -m to print the config (of one job: give one value per key)", file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)


if __name__ == "__main__":
    from swalab.compat import moved_keys

    from swalab.settings import typed_errors

    # before Hydra, which would say only that the key is not in the config, or refuse the value in its own words
    refused = moved_keys(sys.argv[1:]) or typed_errors(sys.argv[1:])
    if refused:
        print("[swalab] " + "; ".join(refused), file=sys.stderr)
        sys.exit(REFUSED_EXIT_CODE)
    composing_refusals_in_one_line()
