"""Step 2 of a run: lock, load, write, train.

:func:`execute` takes the run directory's lock (``swalab.runlock``: one process per run), loads the
data, builds the model and the resume or branch state, and only then writes the run directory and
trains. A run refused at this point (missing data, weights that do not fit, a branch that would not
equal the straight-through run) removes what it created and leaves an existing run's files untouched.

Data-parallel (several processes, ``swalab.distributed``): rank 0 holds the lock and decides whether the run
trains (another process may have finished it since it was planned); every rank gets its answer, so all
train, skip or fail together. Only rank 0 logs and writes; every rank returns once rank 0 has written the
run's last record.

An error before training starts is a refusal (nothing written) and is raised as it is; an error once training has
started is recorded in ``status.json`` and raised as :class:`TrainingFailed`, so that a caller (``run.py``) tells the
two apart by type. A pause (:class:`swalab.pausing.Preempted`, Ctrl-C) is raised as it is."""

from __future__ import annotations

import contextlib
import traceback
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from swalab import distributed, faults, slurm
from swalab.checkpoint import CheckpointStore, atomic_save, checkpoint_words, save_predictions
from swalab.cli import Terminated
from swalab.config import ConfigError, build, compile_mode
from swalab.data.classes import keep_classes
from swalab.evaluate import metrics_table
from swalab.identity import DATA_FINGERPRINT, IDENTITY_FILE, group_hash, record
from swalab.logs import epoch_line, get_logger, run_eta, run_log, run_log_only
from swalab.precision import slow_precision
from swalab.runlock import RunLock
from swalab.runstatus import RunStatus
from swalab.tracking import RECORD_FILE, NullTracker, WandbTracker, plan_record, run_labels
from swalab.train.build import (Start, StartKind, build_loaders, build_model, build_val_loader, check_batches_of_one,
                                loss_spec, optimizer_spec, start_of, trainer_options)
from swalab.train.plan import RunPlan, inspect_run_dir
from swalab.rundir import RunDir, write_json, write_text
from swalab.train.records import (append_environment, data_facts, environment_entry, git_info, make_durable, one_line,
                                  remove_killed_writes, seed_everything)
from swalab.pausing import Preempted
from swalab.trainer import Trainer

log = get_logger()


class TrainingFailed(Exception):
    """A run failed after it started training; its ``status.json`` says so and why. The error that failed it is
    ``__cause__`` (``swalab.train.train`` raises that error itself)."""


def given_record(cfg, record: dict | None) -> dict:
    """``{"record": record}`` for a loader that declares the record of its files (``fingerprint.records_files``: it
    takes back the one the plan has just made), else {}."""
    from hydra.utils import get_method

    declares = hasattr(get_method(str(cfg.dataset.source._target_)), "files_record")
    return {"record": record} if record is not None and declares else {}


@dataclass
class Built:
    """Everything a run trains with, built after its lock is held."""

    plan: RunPlan                    # the plan, with the fingerprint of data downloaded while it was built
    trainer: Trainer
    start: Start                     # fresh, resumed, branched or from other weights (build.start_of)
    data_facts: dict | None = None   # what the run found in its data set (data.json)
    cache_note: str | None = None    # where the decoded images were cached, when this run wrote the cache


def build_run(plan: RunPlan) -> Built:
    """Load the data, build the model, loaders and trainer and find how the run starts (no file written)."""
    cfg, run_dir, method = plan.cfg, plan.run_dir, plan.method
    seed_everything(int(cfg.seed), distributed.info().rank)  # each rank its own stream (records.rank_seed)
    device = distributed.local_device(plan.device)
    data = build(cfg.dataset.source, "dataset.source", **given_record(cfg, plan.data_record))
    expected = cfg.dataset.get("num_classes")
    if expected is not None and data.num_classes != expected:
        raise ConfigError(f"dataset.num_classes={expected} but the data at dataset.root has {data.num_classes} classes "
                          f"(outputs of the model's head): set dataset.num_classes={data.num_classes}")
    data = keep_classes(data, cfg.dataset.get("classes"))
    if plan.data_record is None and getattr(data, "record", None) is not None:  # downloaded just now
        plan = replace(plan, data_record=data.record,
                       identity={**plan.identity, DATA_FINGERPRINT: data.record["fingerprint"]})
        inspect_run_dir(run_dir, plan.identity, cfg.run.resume, data.record)
    train_loader, test_loader, bn_loader = build_loaders(cfg, data, device)
    val_loader = build_val_loader(cfg, data, device)
    method.validate_steps(len(train_loader))
    model = build_model(cfg, data)
    check_batches_of_one(model, train_loader, device)
    start = start_of(cfg, run_dir, plan.identity, method, model, len(train_loader))
    options = trainer_options(cfg, method.epochs)
    trainer = Trainer(model, method, train_loader, test_loader, bn_loader, device, run_dir, options,
                      identity=plan.identity, optimizer=optimizer_spec(cfg), loss=loss_spec(cfg).build(data.num_classes),
                      val_loader=val_loader)
    return Built(plan=plan, trainer=trainer, start=start,
                 data_facts=data_facts(data, plan.data_record), cache_note=getattr(data, "cache_note", None))


class FoundFinished(dict):
    """The final metrics of a run :func:`execute` found finished and did not train: planned so (``RunPlan.skips``),
    or finished by another process between the plan and the lock. A grid records its job as skipped, not complete."""


def execute(plan: RunPlan) -> dict:
    """Train the run ``plan`` describes (step 2 of the module doc) and return its final metrics: claim it (skip a
    finished run, take its lock), build what it trains with (nothing written: a refusal here leaves nothing behind),
    then train and record it (:func:`_train`; a failure there is raised as :class:`TrainingFailed`). A run found
    finished returns its metrics as :class:`FoundFinished`."""
    distributed.init_distributed(str(plan.cfg.run.device))  # no-op unless launched by torchrun or srun (several tasks)
    finished, lock = claim(plan)
    if finished is not None:  # nothing to train: skipped
        return FoundFinished(finished)
    with contextlib.ExitStack() as held:
        if lock is not None:
            held.callback(lock.release)  # however the run ends (a discarded lock is released already)
        with warnings_of_the_build() as early:
            try:
                built = build_run(plan)
            except BaseException:
                if lock is not None:
                    lock.discard()  # a refused run leaves no directory behind
                raise
        try:
            return _train(built, lock, early)
        except Preempted:  # a pause, not a failure
            raise
        except Exception as exc:
            raise TrainingFailed(f"{built.plan.run_dir} failed: {one_line(exc)}") from exc


@contextlib.contextmanager
def warnings_of_the_build():
    """Warnings raised while a run is built (a corrupt checkpoint skipped), held back so that they reach the run's
    ``run.log`` too once it is open (:func:`show` in :func:`_train`); shown at once when the build fails."""
    caught: list = []  # filled when the build ends, outside the recording (where showing one would record it again)
    try:
        with warnings.catch_warnings(record=True) as recorded:
            try:
                yield caught
            finally:
                caught.extend(recorded)
    except BaseException:
        show(caught)
        raise


def claim(plan: RunPlan) -> tuple[dict | None, RunLock | None]:
    """``(metrics of the finished run, None)`` when there is nothing to train, else ``(None, the run's lock)``
    (the lock on rank 0 only).

    Rank 0 decides: a run planned as finished is skipped; otherwise rank 0 takes the lock and looks again, since
    another process may have finished the run since it was planned. Every rank gets rank 0's answer, and an error
    of rank 0's (the run locked by another process) is raised on every rank: a rank going on alone would wait for
    the others in DDP's setup forever."""
    lock, answer = None, None
    if distributed.is_main():
        try:
            finished = plan.finished
            if plan.skips:
                log.info(f"[swalab] {plan.run_dir} already holds a finished run of this config; skipping (metrics.json "
                         "kept)")
                if RunDir(plan.run_dir).status() != RunStatus.COMPLETE:  # killed between metrics.json and its status
                    settle_finished(plan)
            else:
                lock = RunLock(plan.run_dir).acquire()
                remove_killed_writes(plan.run_dir)  # under the lock: no live process writes them
                finished = inspect_run_dir(plan.run_dir, plan.identity, plan.cfg.run.resume, again=True)
                if finished is not None:
                    log.info(f"[swalab] {plan.run_dir} was finished by another process meanwhile; skipping")
                    lock.release()
                    lock = None
            answer = {"finished": finished}
        except BaseException as exc:
            if lock is not None:  # a refusal leaves nothing behind (RunLock.discard)
                lock.discard()
            distributed.from_rank_0({"error": one_line(exc)})
            raise
    answer = distributed.from_rank_0(answer)
    if "error" in answer:
        raise RuntimeError(f"rank 0 could not start {plan.run_dir}: {answer['error']}")
    return answer["finished"], lock


def as_run(resolved: dict, method) -> dict:
    """The resolved config as the run used it: ``model.budget_epochs`` is the B the run trained with, which
    follows ``trainer.epochs`` when that was set (``trainer.epochs=3`` of SWA 1.5B is B = 2, not the model's 150)."""
    b = method.budget_epochs
    model = {**resolved.get("model", {}), "budget_epochs": int(b) if float(b).is_integer() else round(b, 6)}
    return {**resolved, "model": model}


def write_run_files(plan: RunPlan, lineage: dict | None, facts: dict | None = None) -> None:
    if not distributed.is_main():
        return
    run_dir = plan.run_dir
    write_text(run_dir / RunDir.CONFIG, OmegaConf.to_yaml(OmegaConf.create(as_run(plan.resolved, plan.method))))
    write_json(run_dir / IDENTITY_FILE, record(plan.identity, plan.settings))
    if plan.overrides is not None:
        write_text(run_dir / RunDir.OVERRIDES, OmegaConf.to_yaml(OmegaConf.create(plan.overrides)))
    git = git_info()  # two git commands: asked once, recorded in both files
    write_json(run_dir / RunDir.GIT, git)
    append_environment(run_dir, environment_entry(plan.device, git, str(plan.cfg.trainer.precision),
                                                  compile_mode(plan.cfg.run.compile), bool(plan.cfg.run.deterministic)))
    if facts is not None:
        write_json(run_dir / RunDir.DATA, facts)
    if lineage is not None:
        write_json(run_dir / RunDir.LINEAGE, lineage)
    write_json(run_dir / RunDir.STATUS, {"status": RunStatus.RUNNING})


def wandb_run(plan: RunPlan) -> dict | None:
    """Who this run is on W&B (``swalab.tracking``): the W&B run id kept in ``wandb_run.json`` (a new
    one the first time), its name, group, job type and tags; None unless ``logger`` is W&B.

    ``logger.name``, ``logger.group`` and ``logger.job_type`` replace the computed ones when set;
    ``logger.tags`` come before the computed tags."""
    cfg = plan.cfg
    target = cfg.logger.get("_target_")
    if not target or not issubclass(get_class(str(target)), WandbTracker):
        return None
    labels = run_labels(str(cfg.dataset.name), str(cfg.model.name), str(cfg.method.name), cfg.seed, plan.apart,
                        group_hash(plan.identity), plan.grid)
    for key in ("name", "group", "job_type"):
        if cfg.logger.get(key):
            labels[key] = str(cfg.logger[key])
    labels["tags"] = list(dict.fromkeys([*map(str, cfg.logger.get("tags") or []), *labels["tags"]]))
    return plan_record(plan.run_dir, labels, str(cfg.logger.project), cfg.logger.get("entity"))


def make_tracker(plan: RunPlan, built: Built):
    """The logger of ``plan`` (``logger=``): the resolved config with the identity's hashes, and for W&B
    the run of :func:`wandb_run`, continued past the epochs it already holds when this run resumes."""
    if not distributed.is_main():
        return NullTracker()
    config = {**plan.resolved, "identity": {k: v for k, v in record(plan.identity).items() if k != "identity"}}
    if built.start.lineage is not None:
        config["lineage"] = built.start.lineage
    labels = wandb_run(plan)
    kwargs = {}
    if labels is not None:
        write_json(plan.run_dir / RECORD_FILE, labels)
        resumed = built.start.kind is StartKind.RESUME  # a branch's W&B run starts empty
        kwargs = {"run_id": labels["id"], "name": labels["name"], "group": labels["group"],
                  "job_type": labels["job_type"], "tags": labels["tags"],
                  "logged_through": int(built.start.state["epoch"]) if resumed else 0}
    return instantiate(plan.cfg.logger, _partial_=True)(run_dir=str(plan.run_dir), run_config=config, **kwargs)


def show(caught: list) -> None:
    """Show warnings held back while a run was built (a corrupt checkpoint skipped): on stderr as usual, and in
    ``run.log`` when it is open (``swalab.logs.run_log``)."""
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def settle_finished(plan: RunPlan) -> None:
    """The last step of a finished run (its ``metrics.json`` written): make its final records durable, delete the
    checkpoints only a resume reads (``CheckpointStore.release_resume_state``; ``run.keep_finished_checkpoints``
    keeps them), then mark it complete. A kill at any point leaves ``metrics.json`` in place and ``status.json`` not
    yet complete, and the same command, skipping the run, comes here again (:func:`claim`)."""
    if not distributed.is_main():
        return
    run_dir = plan.run_dir
    if not plan.cfg.run.get("keep_finished_checkpoints", False):
        try:
            make_durable(run_dir, RunDir.FILES)
            CheckpointStore(run_dir).release_resume_state()
        except OSError as exc:  # the run has finished: a checkpoint left behind costs only disk
            log.warning(f"[swalab] {run_dir}: could not remove its resume checkpoints ({exc}); final.pt holds the "
                        "finished weights, so they can be deleted by hand")
    RunDir(run_dir).write_status({"status": RunStatus.COMPLETE})


def _record_stop(run_dir: Path, exc: BaseException) -> None:
    """The status of a run stopped by ``exc`` before its ``metrics.json``: paused (under SLURM requeued, cancelled or
    preempted), interrupted (Ctrl-C outside the training steps: before the first, the final scoring), else failed."""
    if isinstance(exc, Preempted):
        exc.status = slurm.stop_status(exc.signum, exc.status)
        RunDir(run_dir).write_status({"status": exc.status, "message": str(exc)})
        run_log_only(f"[swalab] {run_dir} {exc.status}: {exc}")  # run.py says it on the terminal
    elif isinstance(exc, KeyboardInterrupt):
        message = (f"{'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C (SIGINT)'} received outside the training "
                   "steps: the newest checkpoint, if any, is kept; re-run the same command to continue")
        RunDir(run_dir).write_status({"status": RunStatus.INTERRUPTED, "message": message})
        run_log_only(f"[swalab] {run_dir} interrupted: {message}")  # run.py says it on the terminal
    else:
        RunDir(run_dir).write_status({"status": RunStatus.FAILED, "error": one_line(exc), "traceback": traceback.format_exc()})
        log.info(f"[swalab] {run_dir} failed: {one_line(exc)}")


def _train(built: Built, lock: RunLock | None, early: list = ()) -> dict:
    plan = built.plan
    run_dir, trainer, method, start = plan.run_dir, built.trainer, plan.method, built.start
    write_run_files(plan, start.lineage, built.data_facts)
    with run_log(run_dir, main=distributed.is_main()):
        tracker = NullTracker()  # until the run's own is made: a Ctrl-C before then still ends as interrupted
        try:
            show(early)
            if built.cache_note:  # the first line a run writes names the decode cache it created
                log.info(f"[swalab] {built.cache_note}")
            if lock is not None and lock.took_over():
                log.info(f"[swalab] {lock.took_over()}")
            if start.kind is StartKind.RESUME:
                done, step = int(start.state["epoch"]), int(start.state.get("step", 0))
                log.info(f"[swalab] resuming {run_dir} from {start.state['path']} "
                         f"({checkpoint_words(done, step)})")
            else:
                log.info(f"[swalab] training {run_dir} ({method.name}, {method.epochs} "
                         f"epoch{'s' * (method.epochs != 1)}, identity {record(plan.identity)['hash']})")
            slow = slow_precision(plan.device, str(plan.cfg.trainer.precision))
            if slow:  # said once, at each start: a resumed run is as slow
                log.warning(f"[swalab] {slow}")
            faults.hit("run_start")  # test-only kill/signal point (swalab.faults)
            tracker = make_tracker(plan, built)

            def on_epoch(row: dict) -> None:
                tracker.log_epoch(row)
                log.info(epoch_line(row, method.epochs, run_eta(trainer.history, trainer.opts.epochs, row["epoch"])))

            if start.kind is StartKind.BRANCH:  # the trunk's epochs are this run's history too
                for row in start.state["history"]:
                    tracker.log_epoch(row)
            evaluation = trainer.fit(start.state, on_epoch=on_epoch)
            metrics = evaluation.metrics
            final = {"model": trainer.model.state_dict(), "methods": method.final_weights(), "epoch": method.epochs,
                     "identity": plan.identity}
            if distributed.is_main():
                atomic_save(final, run_dir / RunDir.FINAL)
            tracker.final_checkpoint(run_dir / RunDir.FINAL)
            write_json(run_dir / RunDir.RELIABILITY, evaluation.reliability)
            if distributed.is_main():
                save_predictions(evaluation.log_probs, evaluation.labels, run_dir / RunDir.PREDICTIONS)
                for name, obj in method.artifacts(trainer.ctx).items():
                    atomic_save(obj, run_dir / name)
            write_json(run_dir / RunDir.METRICS, metrics)  # last: from here on the run is finished (final_metrics)
            faults.hit("final_record")  # test-only kill point (swalab.faults)
        except BaseException as exc:
            _record_stop(run_dir, exc)
            tracker.finish(exit_code=1)
            raise
        settle_finished(plan)
        tracker.results(metrics, evaluation.reliability)
        tracker.finish()
        log.info(metrics_table(metrics))
    distributed.barrier()  # every rank leaves together, once rank 0 has written the run's records
    return metrics
