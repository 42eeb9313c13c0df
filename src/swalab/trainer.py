"""The one training loop every method runs through.

The trainer owns the device and memory layout (channels_last, optional ``torch.compile``), the per-epoch history,
checkpoints and resuming, and hands each batch to the step (``swalab.step``: precision, accumulation, clipping, the
update), eagerly or replayed from a CUDA graph (``swalab.graphed``). It knows no method by name: it asks the method
for the learning rate of every step and calls its hooks (``swalab.methods.base``). At the end every predictor the
method hands back is scored the same way (``swalab.evaluate.score_predictors``).

Resuming is exact. A checkpoint holds the model, optimizer, method state, the RNG states (CPU, and the
training GPU's generator; under data parallelism every rank's), the history so far and the position in
the epoch; the data order and augmentation of an epoch depend only on (seed, epoch), so a run resumed from
a checkpoint written mid-epoch (after a pause signal, ``swalab.pausing``) or at an epoch boundary (after a kill)
ends with the same weights as one that ran straight through. On a GPU that takes ``run.deterministic`` (the default).

The step is free of host syncs unless something asks for one: no value is read back from the device
inside it when no progress bar is shown (``trainer.nonfinite=skip`` reads the loss each step, by its nature).
Under data parallelism every decision that changes what the ranks do next (skip a step, pause for a signal)
is agreed across them first (``swalab.distributed.agree``); a single process makes no collective for it."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from swalab import distributed, faults
from swalab.checkpoint import (CheckpointStore, PredictionFiles, checkpoint_name, checkpoint_words, restore_rng,
                               rng_state)
from swalab.config import check_monitoring, compile_mode
from swalab.evaluate import (Evaluation, labels_of, mean_loss_and_accuracy, predict_log_probs, recompute_bn,
                             score_predictors)
from swalab.graphed import GraphedStep, graph_refusal, graphed_step
from swalab.logs import heartbeat, mean_epoch_seconds, progress_bar, run_eta
from swalab.losses import LossSpec, TrainingLoss
from swalab.methods.base import Method, TrainContext
from swalab.optim import OptimizerSpec, load_optimizer_state
from swalab.rundir import RunDir
from swalab.pausing import PauseFlag, Preempted, catching_pause_signals, signal_words
from swalab.precision import check_precision, deterministic
from swalab.snapshots import SnapshotWriter
from swalab.settings import TrainerOptions
from swalab.step import EpochTally, NonFiniteLossError, TrainingStep, first_bad_step, skip_nonfinite

log = logging.getLogger("swalab.trainer")


# What a Trainer built without an optimizer or a loss trains with: SGD with the paper's momentum, plain cross-entropy.
DEFAULT_OPTIMIZER = OptimizerSpec("torch.optim.SGD", {"momentum": 0.9})


class Trainer:
    def __init__(self, model: nn.Module, method: Method, train_loader, test_loader, bn_loader: Iterable,
                 device: torch.device, run_dir: str | Path, options: TrainerOptions,
                 identity: dict | None = None,
                 optimizer: OptimizerSpec = DEFAULT_OPTIMIZER, loss: TrainingLoss | None = None,
                 val_loader: Iterable | None = None):
        """``val_loader``: the validation split (``dataset.val_size``), or None. The BN-update loader must read the
        training split only: a validation image that set BN statistics would no longer be held out."""
        self.device, self.opts, self.method = device, options, method
        self.run_dir = Path(run_dir)
        self.store = CheckpointStore(self.run_dir, keep=options.keep_checkpoints)
        self.train_loader, self.test_loader, self.bn_loader = train_loader, test_loader, bn_loader
        self.val_loader = val_loader
        check_monitoring(options.eval_split, options.temperature_scaling, has_val_split=val_loader is not None)
        self.identity = identity or {}
        self.on_epoch: Callable[[dict], None] | None = None  # fit's: called with each epoch's history row
        self.model = model.to(device)
        if options.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        # DDP when launched by torchrun (swalab.distributed); methods see the bare self.model
        self.forward_model = distributed.wrap(self.model, device)
        self.compile_mode = mode = compile_mode(options.compile)  # run.compile: torch.compile's mode, or None
        self.forward_model = torch.compile(self.forward_model, mode=mode) if mode else self.forward_model
        self.main = distributed.is_main()  # only rank 0 writes checkpoints and history, logs and shows a bar
        self.ranks = distributed.info()
        self.snapshots = SnapshotWriter(self.run_dir, options.snapshots, write=self.main,  # run.snapshots
                                        powerema=tuple(options.powerema or ()))  # run.powerema
        self.optimizer = optimizer.build(self.model, lr=method.step_lr(0, 0, 1))
        self.step = TrainingStep(self.model, self.forward_model, self.optimizer,
                                 loss if loss is not None else LossSpec().build(num_classes=0), device,
                                 check_precision(options.precision), options.accumulate, options.clip_grad_norm)
        self.ungraphed_because = self._graph_refusal()  # None: the training step runs as a CUDA graph
        self.history: list[dict] = []
        self.graphed: GraphedStep | None = None  # fit's CUDA-graphed step (swalab.graphed), when this run has one
        self._pending_log: dict = {}
        self.pause = PauseFlag(distributed.agree if self.ranks.enabled and options.handle_signals else None)
        self.test_labels = labels_of(test_loader)
        self.val_labels = labels_of(val_loader) if val_loader is not None else None
        self.ctx = TrainContext(model=self.model, device=device, epochs=options.epochs,
                                steps_per_epoch=len(train_loader), run_dir=self.run_dir,
                                update_bn=self.update_bn, test_log_probs=self.test_log_probs,
                                test_labels=self.test_labels, log=self._pending_log.update,
                                val_log_probs=self.val_log_probs if val_loader is not None else None,
                                val_labels=self.val_labels, eval_split=options.eval_split,
                                predictions=PredictionFiles(self.run_dir, write=self.main),
                                train_data=train_loader, val_data=val_loader)

    # -- services lent to methods --------------------------------------------------------
    def update_bn(self, model: nn.Module) -> None:
        """Recompute BN statistics of ``model`` over the training data (exact average, no grad, float32)."""
        if hasattr(self.bn_loader, "set_epoch"):
            self.bn_loader.set_epoch(0)
        recompute_bn(model, faults.watch(self.bn_loader, "bn_update"), self.device)

    def test_log_probs(self, model: nn.Module) -> torch.Tensor:
        """``model``'s test log-probabilities, in float32."""
        return predict_log_probs(model, self.test_loader, self.device)

    def val_log_probs(self, model: nn.Module) -> torch.Tensor:
        """``model``'s log-probabilities on the validation split, in float32."""
        return predict_log_probs(model, self.val_loader, self.device)

    # -- checkpoints -------------------------------------------------------------------
    def state(self, epoch: int, step: int, partial: dict | None = None, rng_ranks: list[dict] | None = None) -> dict:
        """What a checkpoint holds (module doc); ``rng_ranks``: every rank's generator states, rank 0's first."""
        state = {"epoch": epoch, "step": step, "model": self.model.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
                 "rng": rng_state(self.device), "history": self.history, "partial": partial or {},
                 "identity": self.identity}
        if self.step.scaler is not None:  # fp16: the loss scale and its growth tracker
            state["scaler"] = self.step.scaler.state_dict()
        if rng_ranks is not None and len(rng_ranks) > 1:
            state["rng_ranks"] = rng_ranks
        if self.snapshots.power is not None:  # run.powerema: the averages so far, to continue them exactly
            state["powerema"] = self.snapshots.state_dict()
        return state

    def save(self, epoch: int, step: int = 0, partial: dict | None = None) -> Path:
        """Checkpoint after ``epoch`` whole epochs and ``step`` steps of the next one. Data-parallel: every rank
        calls it; rank 0 writes, with every rank's generator states, and no rank returns before the file is
        written (a rank that left first could have its launcher stop rank 0 mid-write)."""
        rng_ranks = distributed.gather_objects(rng_state(self.device)) if self.ranks.enabled else None
        path = self.store.dir / checkpoint_name(epoch, step)
        if self.main:
            path = self.store.save(self.state(epoch, step, partial, rng_ranks), epoch, step)
        distributed.barrier()
        return path

    def restore(self, state: dict) -> tuple[int, int, dict]:
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        if self.step.scaler is not None and state.get("scaler"):
            self.step.scaler.load_state_dict(state["scaler"])
        if state.get("method") is not None:  # None: a branch (run.branch_from) starts its method fresh
            self.method.load_state_dict(state["method"], self.ctx)
        self.history = list(state["history"])
        self.snapshots.load_state_dict(state.get("powerema"), self.device,
                                       checkpoint_words(int(state["epoch"]), int(state.get("step", 0))))
        restore_rng(state, self.ranks.rank, self.ranks.world_size, self.device, warn=self.main)
        self._write_history()
        return int(state["epoch"]), int(state.get("step", 0)), dict(state.get("partial") or {})

    def _write_history(self) -> None:
        if not self.main:
            return
        path = self.run_dir / RunDir.HISTORY
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in self.history))
        tmp.replace(path)

    # -- the loop ------------------------------------------------------------------------
    def fit(self, resume: dict | None = None, on_epoch: Callable[[dict], None] | None = None) -> Evaluation:
        """Train from the start, or from ``resume`` (a checkpoint's state), then score every predictor; ``on_epoch``
        gets each epoch's history row (on the writing rank: the run's log line, the W&B tracker)."""
        self.on_epoch = on_epoch
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with deterministic(self.device, self.opts.deterministic):
            self.method.on_train_start(self.ctx)
            start_epoch, start_step, partial = 0, 0, {}
            if resume is not None:
                start_epoch, start_step, partial = self.restore(resume)
            skips = int(partial.get("skips", 0))
            self.ungraphed_because = self._graph_refusal()  # again: the restored optimizer's groups
            self.graphed = graphed_step(self.opts.cuda_graphs, self.device, self.step.whole, self.optimizer,
                                        self.ungraphed_because, log.info if self.main else lambda line: None)
            with catching_pause_signals(self.pause.note, self.opts.handle_signals):
                for epoch in range(start_epoch, self.opts.epochs):
                    tally = self._train_epoch(epoch, start_step if epoch == start_epoch else 0, partial, skips)
                    partial, skips = {}, tally.skips
                    self._end_epoch(epoch, tally)
            return self.evaluate()

    def _train_epoch(self, epoch: int, first_step: int, partial: dict, skips: int) -> EpochTally:
        """The optimizer steps of one epoch from ``first_step`` (a mid-epoch resume carries ``partial`` sums)."""
        steps = len(self.train_loader)
        tally = EpochTally(t0=time.perf_counter() - float(partial.get("seconds", 0.0)),
                           loss_sum=torch.tensor(float(partial.get("loss_sum", 0.0)), device=self.device),
                           correct=torch.tensor(float(partial.get("correct", 0.0)), device=self.device),
                           seen=int(partial.get("seen", 0)), skips=skips,
                           lr=self.method.step_lr(epoch, first_step, steps))
        bad_step = torch.tensor(-1, device=self.device)
        self.model.train()
        if hasattr(self.train_loader, "set_epoch"):
            self.train_loader.set_epoch(epoch)
        bar = progress_bar(epoch, self.opts.epochs, steps, first_step, run_eta(self.history, self.opts.epochs, epoch),
                           False if not self.main else self.opts.progress)
        beat = (heartbeat(epoch, self.opts.epochs, steps, first_step, self.opts.heartbeat_minutes,
                          mean_epoch_seconds(self.history), log.info) if bar is None and self.main else None)
        for step, (x, y) in enumerate(self.train_loader):
            if step < first_step:
                continue
            tally.lr = self.method.step_lr(epoch, step, steps)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            x, target = self.step.loss.prepare(x, y)  # mixup/cutmix when asked (swalab.losses)
            loss, correct = (self.graphed(x, target, tally.lr) if self.graphed is not None
                             else self._eager_step(x, target, epoch, step, tally))
            if loss is None:  # a non-finite loss, skipped (trainer.nonfinite=skip)
                continue
            bad_step = torch.where((bad_step < 0) & ~torch.isfinite(loss), step, bad_step)
            self.method.on_step_end(self.ctx, epoch, step)
            self.snapshots.after_step(self.model, epoch, step, steps)
            faults.hit("train_step")  # test-only kill/signal point (swalab.faults)
            tally.loss_sum += loss.float() * y.shape[0]
            tally.correct += correct
            tally.seen += y.shape[0]
            if bar is not None:
                if step % 10 == 0:
                    bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{tally.accuracy():.1f}", lr=f"{tally.lr:.4g}")
                bar.update(1)
            if beat is not None and step + 1 < steps:
                beat(step, tally.t0)
            if step + 1 < steps and self.pause.paused():
                self.save(epoch, step + 1, tally.partial())
                raise Preempted(f"{signal_words(self.pause.signum)} received: checkpoint "
                                f"{checkpoint_name(epoch, step + 1)} written ({checkpoint_words(epoch, step + 1)})",
                                self.pause.signum)
        if bar is not None:
            bar.close()
        first_bad = first_bad_step(bad_step, self.ranks.enabled)
        if first_bad is not None:
            raise NonFiniteLossError(
                f"the training loss became NaN/Inf at epoch {epoch + 1}, step {first_bad + 1}; {self.store.kept_words()}. "
                "Lower the learning rate or set trainer.nonfinite=skip.")
        return tally

    def _graph_refusal(self) -> str | None:
        """Why this run trains eagerly rather than as a CUDA graph, or None (``swalab.graphed.graph_refusal``)."""
        return graph_refusal(self.opts.cuda_graphs, self.device, self.optimizer, accumulate=self.opts.accumulate,
                             nonfinite=self.opts.nonfinite, data_parallel=self.ranks.enabled,
                             compiled=self.compile_mode, grad_scaled=self.step.scaler is not None)

    def _eager_step(self, x: torch.Tensor, target, epoch: int, step: int, tally: EpochTally):
        """One optimizer step run eagerly: ``(loss, correct)``, or ``(None, None)`` when ``trainer.nonfinite=skip``
        drops the step for its non-finite loss (its gradients dropped with it)."""
        for group in self.optimizer.param_groups:
            group["lr"] = tally.lr
        self.optimizer.zero_grad(set_to_none=True)
        loss, correct = self.step.forward_backward(x, target)
        if self.opts.nonfinite == "skip" and skip_nonfinite(loss, epoch, step, tally.skips, self.opts.max_skips,
                                                            self.ranks.enabled, self.main, self.store.kept_words):
            self.optimizer.zero_grad(set_to_none=True)
            tally.skips += 1
            return None, None
        self.step.update()
        return loss, correct

    def _end_epoch(self, epoch: int, tally: EpochTally) -> None:
        """The method's epoch hook, the history row (scored every ``eval_every`` epochs), the checkpoint."""
        self.method.on_epoch_end(self.ctx, epoch)
        done = epoch + 1
        self.snapshots.after_epoch(self.model, done, len(self.train_loader))
        last = done == self.opts.epochs
        row = {"epoch": done, "lr": tally.lr, "train_loss": float(tally.loss_sum) / max(tally.seen, 1),
               "train_acc": tally.accuracy()}
        if last or (self.opts.eval_every and done % self.opts.eval_every == 0):
            split = self.opts.eval_split  # test_loss/test_acc, or val_loss/val_acc (run.eval_split=val)
            loader, labels = (self.test_loader, self.test_labels) if split == "test" else (self.val_loader,
                                                                                            self.val_labels)
            row[f"{split}_loss"], row[f"{split}_acc"] = mean_loss_and_accuracy(self.model, loader, self.device,
                                                                               labels=labels)
        row.update(self._pending_log)
        self._pending_log.clear()
        row["seconds"] = time.perf_counter() - tally.t0
        self.history.append(row)
        self._write_history()
        if self.on_epoch is not None and self.main:
            self.on_epoch(row)
        paused = self.pause.paused()
        if last or done % self.opts.checkpoint_every == 0 or done in self.opts.save_at or paused:
            self.save(done)
            if done in self.opts.save_at and self.main:
                self.store.keep_for_good(done)
        if paused:  # in the last epoch too: its checkpoint is written, and a re-run only scores the run
            raise Preempted(f"{signal_words(self.pause.signum)} received: checkpoint {checkpoint_name(done)} written "
                            f"({checkpoint_words(done)})", self.pause.signum)

    def evaluate(self) -> Evaluation:
        """Score every predictor the method hands back, the same way (``swalab.evaluate.score_predictors``), with
        what the method adds of its own (FGE's member curve, SWAG's samples)."""
        scored = score_predictors(self.method.predictors(self.ctx), self.test_loader, self.test_labels,
                                  self.val_loader, self.val_labels, self.opts.temperature_scaling, self.method.describe)
        for name, extra in self.method.extra_metrics(self.ctx, self.test_labels).items():
            scored.metrics.setdefault(name, {}).update(extra)
        return scored
