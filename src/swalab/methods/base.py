"""The hook protocol between the shared trainer and a training method.

The trainer knows no method by name. It asks the method for the learning rate of every step,
calls its hooks at fixed points of the loop, and at the end asks it for named *predictors*
(``{"swa": model, "sgd": model}``, ``{"fge": ensemble}``) that the evaluators score the same way.
Adding a method is one ``methods/x.py`` and one ``conf/method/x.yaml``; the loop stays as it is.

Hooks run in this order::

    on_train_start(ctx)                      once; on a resume, load_state_dict(state, ctx) follows
    for epoch:
        for step:  step_lr(...) (lr_at x warmup) -> optimizer step -> on_step_end(ctx, epoch, step)
        on_epoch_end(ctx, epoch)
    predictors(ctx)                           once, after the last epoch

A method's ``state_dict`` goes into every checkpoint, so resuming in the middle of averaging
restores the average exactly. It holds weights and state; test-set predictions a method keeps (FGE's members)
go to ``ctx.predictions`` once each, and the state names them (``swalab.checkpoint.PredictionFiles``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from swalab.checkpoint import PredictionFiles
from swalab.config import ConfigError, epochs_of_budget, require
from swalab.evaluate import ModelPredictor, Predictor
from swalab.schedules import PaperSGD, Schedule, warmup_factor


@dataclass
class TrainContext:
    """What the trainer lends to a method: the live model and the means to score and re-estimate.

    ``update_bn(model)`` recomputes a model's BatchNorm statistics with one pass over the
    training data (train mode, exact cumulative average, no grad; never the validation split);
    ``test_log_probs(model)`` gives its log-probabilities on the test set (labels in ``test_labels``);
    ``val_log_probs(model)`` on the validation split (``dataset.val_size``; labels in ``val_labels``), None
    without one: a method that keeps predictions it computed once (FGE's members, SWAG's samples) keeps them for
    both, so that its predictors can be scored and temperature-scaled on the validation split too. Scoring and BN
    updates run in float32 whatever the training precision. ``eval_split`` is the split per-epoch monitoring scores
    (``run.eval_split``: ``test`` or ``val``); ``log`` adds values to the current epoch's line of the run's history;
    ``predictions`` keeps the predictions a method computed in files of their own, outside the checkpoints."""

    model: nn.Module
    device: torch.device
    epochs: int
    steps_per_epoch: int
    run_dir: Path
    update_bn: Callable[[nn.Module], None]
    test_log_probs: Callable[[nn.Module], torch.Tensor]
    test_labels: torch.Tensor
    log: Callable[[dict], None] = field(default=lambda row: None)
    val_log_probs: Callable[[nn.Module], torch.Tensor] | None = None
    val_labels: torch.Tensor | None = None
    eval_split: str = "test"
    predictions: PredictionFiles | None = None  # None: PredictionFiles(run_dir)
    train_data: Iterable | None = None  # the training loader, (x, y) batches augmented as in training: what a method fits on (Laplace)
    val_data: Iterable | None = None    # the validation split's loader (dataset.val_size), or None

    def __post_init__(self) -> None:
        if self.predictions is None:
            self.predictions = PredictionFiles(self.run_dir)

    def log_probs_on(self, split: str, model: nn.Module) -> torch.Tensor:
        """``model``'s log-probabilities on ``split`` (``test`` or ``val``)."""
        return self.test_log_probs(model) if split == "test" else self.val_log_probs(model)

    def labels_on(self, split: str) -> torch.Tensor:
        return self.test_labels if split == "test" else self.val_labels


class Method:
    """Base class: plain SGD behaviour, every hook a no-op. Subclasses override what they need.

    ``schedule`` is the base learning-rate schedule from ``conf/schedule``; methods that add a
    phase of their own (SWA, FGE) switch away from it at their start epoch. ``epochs`` is the run's
    length and ``budget`` its length in budgets, so the budget ``B = epochs / budget`` follows the
    run: settings given as fractions of B (SWA's start, FGE's pretraining) scale with a short run."""

    name = "method"
    # False for a method that trains nothing (Pretrained scores the weights it starts from): what only training reads
    # (the optimizer, schedule, loss and trainer groups, ``swalab.identity.TRAINING_GROUPS``) then sets none of its
    # runs apart, in their identity or their directory's name.
    trains: bool = True
    # Settings that only add measurements (scoring the method's model during training) and never change a weight
    # or a final number: a report does not set runs apart by them.
    scoring_settings: tuple[str, ...] = ()
    # The predictors a report shows as this method's columns, in their order; empty: the one named after the method.
    columns: tuple[str, ...] = ()
    # Why the method needs a validation split (``dataset.val_size``), or None: a run without one is refused before
    # anything is written (swalab.train.plan.validate).
    needs_validation_split: str | None = None
    # Another method's columns this one fills where no run of that method does (SWAG trains exactly as SWA).
    stands_in: tuple[str, ...] = ()
    # The predictor of the live weights (the model the trainer trained, or loaded for a method that trains nothing):
    # the name ``predictors`` gives it in metrics.json and re-scoring gives it again (swalab.results.compare); None for
    # a method that does not score them (FGE: its last iterate is mid-cycle).
    live: str | None = "sgd"

    def __init__(self, schedule: Schedule, epochs: int, budget: float = 1.0, name: str | None = None):
        self.schedule = schedule
        self.budget = require("method.budget", budget, "number", 0)  # the owner of both: one message each
        self.epochs = require("trainer.epochs", epochs, "int", 0)
        if name is not None:
            self.name = name

    @property
    def budget_epochs(self) -> float:
        """B, the budget in epochs: the run's epochs over its number of budgets."""
        return self.epochs / self.budget if self.budget > 0 else float(self.epochs)

    def epoch_of(self, fraction: float) -> int:
        """``fraction`` of the budget B in whole epochs (0.805 of 200 is epoch 161)."""
        return epochs_of_budget(fraction, self.budget_epochs)

    # -- checks before anything trains ---------------------------------------------------
    def validate(self, initialized: bool) -> None:
        """Raise ``ValueError`` (``ConfigError``) naming the config key when the settings cannot work.

        ``initialized`` says whether the run starts from trained weights (``model.init_from``,
        ``run.branch_from`` or a pretrained model). Called before anything is written, so a bad
        value costs nothing. Subclasses call ``super().validate(initialized)`` first."""
        if self.epochs == 0:
            raise ConfigError(f"trainer.epochs=0 trains nothing with method={self.name}: use method=pretrained to "
                              "score the starting weights, or train 1 epoch or more (trainer.epochs is method.budget "
                              "x model.budget_epochs unless set itself)")
        if not self.budget > 0:
            raise ConfigError(f"method.budget={self.budget:g} must be > 0 for method={self.name}: a run is "
                              "method.budget budgets of B = model.budget_epochs epochs (B follows trainer.epochs when "
                              "that is set); method=pretrained trains nothing")
        warmup = getattr(self.schedule, "warmup_epochs", 0.0)
        if warmup > self.epochs:
            raise ConfigError(f"schedule.warmup_epochs={warmup:g} is longer than the run's {self.epochs} epochs: the lr "
                              f"would never reach the schedule's. Set schedule.warmup_epochs to at most {self.epochs}")

    def caveats(self) -> list[str]:
        """What a user should know before the run starts although it can run (an FGE "ensemble" of one member):
        each line is shown once at launch, on every run of a grid. The default has none."""
        return []

    def unkept(self, run_dir: Path, metrics: dict) -> list[str]:
        """What this config asks a run to keep (a setting that only says what a run keeps,
        ``swalab.identity.OUTPUT_ONLY``, so no other run) that the finished run in ``run_dir`` (its ``metrics``) did not
        keep, one line each: it is skipped all the same, and said so. The default keeps nothing of its own."""
        return []

    def validate_steps(self, steps_per_epoch: int) -> None:
        """Raise ``ConfigError`` when, with ``steps_per_epoch`` optimizer steps an epoch (known once the data
        are loaded), the method would never act (an EMA updated less often than the run has steps).
        Called after the data are loaded and before anything is written; the default has nothing to check."""

    def describe(self, predictor: str) -> dict[str, float]:
        """What stands behind ``predictor``: its budget (in B) and the epochs trained, for reports."""
        return {"budget": float(self.budget), "epoch": int(self.epochs)}

    def last_branch_epoch(self) -> int:
        """The latest trunk epoch a branch of this method may start from (``run.branch_from``).

        A branch restores the trunk's weights, optimizer and RNG but starts this method's own state
        fresh, so it equals a straight-through run only up to the last epoch after which the method
        still holds no state. The default, 0, is the safe answer for a method that keeps state from
        its first step (EMA); methods that keep none for a while say how long."""
        return 0

    # -- learning rate -------------------------------------------------------------------
    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The method's lr for step ``step`` of ``epoch`` (the base schedule here; SWA and FGE add their phases).
        A method of one's own overrides this; the warmup is applied on top of it by :meth:`step_lr`."""
        return self.schedule.at(epoch, step, steps_per_epoch)

    def step_lr(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The lr the optimizer takes for this step: :meth:`lr_at` times the schedule's linear warmup
        (``schedule.warmup_epochs``, :func:`swalab.schedules.warmup_factor`), whatever the method's phases."""
        warmup = getattr(self.schedule, "warmup_epochs", 0.0)
        lr = self.lr_at(epoch, step, steps_per_epoch)
        return lr * warmup_factor(epoch, step, steps_per_epoch, warmup) if warmup else lr

    # -- hooks -----------------------------------------------------------------------------
    def on_train_start(self, ctx: TrainContext) -> None:
        pass

    def on_step_end(self, ctx: TrainContext, epoch: int, step: int) -> None:
        pass

    def on_epoch_end(self, ctx: TrainContext, epoch: int) -> None:
        pass

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {} if self.live is None else {self.live: ModelPredictor(ctx.model, ctx.device)}

    def extra_metrics(self, ctx: TrainContext, labels: torch.Tensor) -> dict[str, dict]:
        """Metrics beyond accuracy/NLL/ECE, merged into ``metrics.json`` per predictor."""
        return {}

    def artifacts(self, ctx: TrainContext) -> dict[str, object]:
        """Files of the method's own to keep in the run directory after training (``{file name: object}``,
        written with ``torch.save`` by ``swalab.train``), e.g. FGE's cached member probabilities."""
        return {}

    def final_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """State dicts of the method's own models (SWA average, EMA) for the final checkpoint."""
        return {}

    # -- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        pass


def averages_device(avg_device: str, ctx: TrainContext) -> torch.device:
    """Where a method keeps its average (``run.avg_device``): the training device, or the CPU, where WRN-28-10's
    SWA average (146 MB) and EMA copy stay off a small GPU. The result is the same either way: averaging is
    elementwise, and what is scored is scored on the training device (:func:`on_training_device`)."""
    return torch.device("cpu") if avg_device == "cpu" else ctx.device


def on_training_device(module: nn.Module, ctx: TrainContext, for_good: bool) -> nn.Module:
    """``module`` where it is scored, the training device: itself when it lives there; else moved there for good
    (``for_good``: at the end of training, where its recomputed BN statistics go into ``final.pt``), or a copy (a
    score during training, after which the average goes on where it lives)."""
    if next(module.parameters()).device == ctx.device:
        return module
    import copy

    return module.to(ctx.device) if for_good else copy.deepcopy(module).to(ctx.device)


def check_pre_schedule(name: str, schedule: Schedule, method: str, key: str) -> None:
    """``pre_schedule`` of SWA and FGE (``key``: ``method.pre_schedule``): ``reference`` (the paper's shape,
    from ``schedule.lr`` alone) or ``base`` (the schedule group). ``reference`` with a schedule group other than the
    paper's would ignore that schedule without a word, so it is refused, naming the key that makes it count."""
    if name not in ("reference", "base"):
        raise ConfigError(f"{key}={name!r} must be 'reference' or 'base'")
    if name == "reference" and not isinstance(schedule, PaperSGD):
        raise ConfigError(f"method={method} with {key}=reference follows the paper's schedule (from "
                          f"schedule.lr only) and would ignore the chosen schedule ({type(schedule).__name__}): "
                          f"set {key}=base to train with it")


def unread_schedule_keys(schedule: Schedule, epochs: int) -> list[str]:
    """``key=value`` for each setting of the paper's schedule group (``schedule=paper_sgd``) away from its default
    that a ``pre_schedule=reference`` phase never reads: that phase is the paper's shape from ``schedule.lr`` alone
    (its own horizon and final lr), so ``schedule.final_lr``, ``schedule.horizon`` (null: the run's ``epochs``) and
    ``schedule.per_iteration`` set otherwise would not act (``schedule.warmup_epochs`` acts on every phase)."""
    if not isinstance(schedule, PaperSGD):
        return []
    unread = {"final_lr": schedule.final_lr is not None, "horizon": schedule.horizon != epochs,
              "per_iteration": schedule.per_iteration is not False}
    return [f"schedule.{k}={getattr(schedule, k):g}" if k != "per_iteration" else f"schedule.{k}={schedule.per_iteration}"
            for k, unread_here in unread.items() if unread_here]
