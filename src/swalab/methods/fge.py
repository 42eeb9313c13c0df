"""Fast Geometric Ensembling (Garipov et al., NeurIPS 2018), the paper's ensemble baseline.

From a trained start (``model.init_from``, or SGD for ``pretrain`` of the budget B, or exactly
``pretrain_epochs``), run a triangular
cyclic learning rate ``lr_max -> lr_min -> lr_max`` with a period of ``cycle`` epochs and
collect the weights at the middle of every cycle, where the lr is lowest. The ensemble's
prediction is the mean of the members' softmax probabilities.

Each member's test probabilities (and, with a validation split, its probabilities there, on which the
ensemble's ``fge+ts`` temperature is fitted) are computed once, when it is collected, and cached: scoring
the ensemble of the first k members then needs no forward pass, and the whole accuracy/NLL
curve against the number of members comes for free. They are written once, to a file of their own
(``ctx.predictions``), which checkpoints name; a checkpoint holds no member's predictions. With ``save_members`` the members' weights
are written to ``<run>/members/`` so the ensemble can be re-scored on other data later.

The cycle must be an even number of epochs: members are collected at the end of the epoch that
completes the first half of a cycle, as in the reference recipe."""

from __future__ import annotations

from pathlib import Path

import torch

from swalab.checkpoint import CheckpointError, atomic_save
from swalab.config import ConfigError, require
from swalab.evaluate import CachedEnsemble, Predictor
from swalab.logs import get_logger
from swalab.rundir import RunDir, earlier_format
from swalab.methods.base import Method, TrainContext, check_pre_schedule, unread_schedule_keys
from swalab.schedules import PaperSGD, Schedule, fge_cyclic_lr

MEMBER_PROBS_FILE = RunDir.MEMBER_PROBS  # in the run directory: {"member_log_probs", "member_epochs", "labels"}


def member_file(k: int, split: str = "test") -> str:
    """The name of the ``k``-th member's log-probabilities on ``split`` in ``ctx.predictions`` (1-based)."""
    return f"fge_member_{k:03d}" if split == "test" else f"fge_member_{k:03d}_{split}"


def member_weights_file(k: int, epoch: int) -> str:
    """The name of the ``k``-th member's weights in ``<run>/members/`` (1-based ``k``; ``epoch``: the epochs trained
    when it was collected), written with ``method.save_members``."""
    return f"member_{k:03d}_epoch{epoch}.pt"


def member_log_probs_of(record: dict, path: Path) -> list[torch.Tensor]:
    """The members' log-probabilities in the ``fge_member_probs.pt`` at ``path``; one an earlier swalab wrote
    (``member_probs``) is refused with the command that rewrites it (``swalab.upgrade``)."""
    if "member_log_probs" not in record:
        raise CheckpointError(earlier_format(str(path), Path(path).parent))
    return list(record["member_log_probs"])


class FGE(Method):
    """FGE (module doc). Its arguments are the ``method.*`` keys of ``conf/method/fge.yaml``, which read the model's
    recipe block ``model.fge``: ``lr_max`` here is ``method.lr_max`` in every message (named ``model.fge.lr_max`` where
    the value came from there)."""

    name = "fge"
    live = None  # its last iterate is mid-cycle: not a predictor of its own

    def __init__(self, schedule: Schedule, epochs: int, lr_max: float, lr_min: float, cycle_epochs: int = 2,
                 pretrain: float | None = None, pretrain_epochs: int | None = None, pre_schedule: str = "base",
                 bn_update: bool = False, save_members: bool = False, budget: float = 1.0, name: str | None = None):
        super().__init__(schedule, epochs, budget, name)
        self.lr_max = float(require("method.lr_max", lr_max, "number", 0, low_open=True))
        self.lr_min = float(require("method.lr_min", lr_min, "number", 0, low_open=True))
        self.cycle_epochs = require("method.cycle_epochs", cycle_epochs, "int", 2)
        require("method.pretrain", pretrain, "number?", 0)
        require("method.pretrain_epochs", pretrain_epochs, "int?", 0)
        self.pretrain_epochs = (pretrain_epochs if pretrain_epochs is not None else
                                self.epoch_of(pretrain) if pretrain is not None else 0)
        self.pre_schedule = pre_schedule
        self.bn_update, self.save_members = bn_update, save_members
        self.schedule_before_cycles = (PaperSGD(lr=schedule.lr, horizon=max(self.pretrain_epochs, 1))
                                       if pre_schedule == "reference" else schedule)
        self.ensemble = CachedEnsemble()
        self.member_epochs: list[int] = []
        self.member_files: list[str] = []  # each member's log-probabilities in ctx.predictions
        self.member_val_files: list[str] = []  # and on the validation split, when there is one

    def validate(self, initialized: bool) -> None:
        super().validate(initialized)
        epochs = self.epochs
        if self.cycle_epochs % 2:
            raise ConfigError("method.cycle_epochs must be an even number of epochs >= 2 (members are "
                              f"collected at the middle of each cycle), got {self.cycle_epochs}")
        check_pre_schedule(self.pre_schedule, self.schedule, "fge", "method.pre_schedule")
        if self.lr_min > self.lr_max:
            raise ConfigError(f"method.lr_min={self.lr_min:g} is above method.lr_max={self.lr_max:g}: members are "
                              "collected where the cycle's lr is lowest (lr_min), so the cycle would be upside down and "
                              "collect them at its peak. Swap the two values")
        if self.pretrain_epochs == 0 and not initialized:
            raise ConfigError("FGE needs a trained starting point: set model.init_from=<checkpoint or run dir> or "
                              "method.pretrain > 0 (a fraction of the budget trained with SGD before the "
                              "cycles)")
        if epochs - self.pretrain_epochs < self.cycle_epochs // 2:
            left = epochs - self.pretrain_epochs
            raise ConfigError(f"trainer.epochs={epochs} leaves {left} epoch{'s' * (left != 1)} after "
                              f"{self.pretrain_epochs} epoch{'s' * (self.pretrain_epochs != 1)} of pretraining: fewer "
                              "than half a cycle "
                              f"({self.cycle_epochs // 2}), so no member would be collected. Lower method.pretrain (a "
                              "fraction of the budget) or method.cycle_epochs")

    def members_collected(self) -> int:
        """How many members the run collects (one per cycle whose middle it reaches)."""
        return sum(self.is_collection_epoch(e) for e in range(self.epochs))

    def caveats(self) -> list[str]:
        """An "ensemble" of one member, and settings of the schedule group that the reference pre-schedule never reads
        (``methods.base.unread_schedule_keys``; a grid over methods shares them with an SGD run that reads them)."""
        unread = [f"{unread} is not read by method=fge with method.pre_schedule=reference (the paper's shape "
                  f"from schedule.lr over the {self.pretrain_epochs} epochs of pretraining): set "
                  "method.pre_schedule=base to pretrain with the schedule group as configured"
                  for unread in (unread_schedule_keys(self.schedule, self.epochs)
                                 if self.pre_schedule == "reference" and self.pretrain_epochs else [])]
        return unread + self.one_member_caveat()

    def one_member_caveat(self) -> list[str]:
        if self.members_collected() == 1:
            return [f"FGE collects 1 member in trainer.epochs={self.epochs} ({self.pretrain_epochs} of pretraining, cycles "
                    f"of {self.cycle_epochs}): its 'ensemble' is one SGD snapshot. Lengthen the run or lower method.pretrain "
                    "for 2 members or more"]
        return []

    def last_branch_epoch(self) -> int:
        return self.pretrain_epochs + self.cycle_epochs // 2 - 1  # the first member is collected after the next epoch

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        if epoch < self.pretrain_epochs:
            return self.schedule_before_cycles.at(epoch, step, steps_per_epoch)
        return fge_cyclic_lr(epoch - self.pretrain_epochs, step / steps_per_epoch,
                             self.lr_max, self.lr_min, self.cycle_epochs)

    def is_collection_epoch(self, epoch: int) -> bool:
        """Whether a member is collected at the end of (0-based) ``epoch``."""
        e = epoch - self.pretrain_epochs
        return e >= 0 and (e % self.cycle_epochs) + 1 == self.cycle_epochs // 2

    def on_epoch_end(self, ctx: TrainContext, epoch: int) -> None:
        if not self.is_collection_epoch(epoch):
            return
        if self.bn_update:
            ctx.update_bn(ctx.model)
        log_probs = ctx.test_log_probs(ctx.model)
        val_log_probs = ctx.val_log_probs(ctx.model) if ctx.val_log_probs is not None else None
        self.ensemble.add(log_probs, val_log_probs)
        self.member_epochs.append(epoch)
        self.member_files.append(ctx.predictions.save(member_file(len(self.ensemble)), log_probs))
        if val_log_probs is not None:  # a member is scored on the validation split too
            self.member_val_files.append(ctx.predictions.save(member_file(len(self.ensemble), "val"), val_log_probs))
        if self.save_members and ctx.predictions.write:  # the writing rank only
            path = Path(ctx.run_dir) / RunDir.MEMBERS / member_weights_file(len(self.ensemble), epoch + 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save({"model": ctx.model.state_dict(), "epoch": epoch + 1}, path)

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {"fge": self.ensemble}

    def unkept(self, run_dir: Path, metrics: dict) -> list[str]:
        """With ``save_members``: the members whose weights the finished run did not write (it ran without
        ``method.save_members``, which sets no run apart: swalab.identity.OUTPUT_ONLY)."""
        members = (metrics.get("fge") or {}).get("members") if self.save_members else None
        if not isinstance(members, int):
            return []
        kept = len(list((Path(run_dir) / RunDir.MEMBERS).glob("member_*.pt")))
        if kept >= members:
            return []
        return [f"method.save_members=true, but the finished run there kept the weights of {kept} of its {members} "
                "members (it ran without the setting, which sets no run apart); they are kept only by training it "
                "again: remove the directory, or give the run one of its own with run.dir=<dir>"]

    def artifacts(self, ctx: TrainContext) -> dict[str, object]:
        """The members' cached test log-probabilities, as ``<run>/fge_member_probs.pt``: ``python -m swalab.results.compare``,
        the report's section 3.5 and the analyses score the ensemble (and each member) from them, without the
        members' weights (``save_members``)."""
        if not len(self.ensemble):
            return {}
        return {MEMBER_PROBS_FILE: {"member_log_probs": self.ensemble.member_log_probs,
                                    "member_epochs": [e + 1 for e in self.member_epochs],
                                    "labels": ctx.test_labels.cpu()}}

    def extra_metrics(self, ctx: TrainContext, labels: torch.Tensor) -> dict[str, dict]:
        return {"fge": {"members": len(self.ensemble), "member_epochs": [e + 1 for e in self.member_epochs],
                        "curve": self.ensemble.curve(labels)}}

    def state_dict(self) -> dict:
        out = {"member_files": list(self.member_files), "member_epochs": list(self.member_epochs)}
        if self.member_val_files:  # only with a validation split
            out["member_val_files"] = list(self.member_val_files)
        return out

    def load_state_dict(self, state: dict, ctx: TrainContext) -> None:
        if "member_files" not in state:  # an earlier swalab's: the members' predictions inside (swalab.upgrade)
            raise CheckpointError(earlier_format(f"the FGE state of a checkpoint of {ctx.run_dir}", ctx.run_dir))
        self.member_epochs = list(state.get("member_epochs", []))
        if self.save_members and ctx.predictions.write:  # resumed with save_members after members it did not keep
            folder = Path(ctx.run_dir) / RunDir.MEMBERS
            missing = [k for k, e in enumerate(self.member_epochs, start=1)
                       if not (folder / member_weights_file(k, e + 1)).exists()]
            if missing:
                get_logger().warning("[swalab] method.save_members=true, but the weights of member(s) "
                                     f"{', '.join(map(str, missing))} of {len(self.member_epochs)} collected before "
                                     "this resume were not kept (the run ran without the setting): only the members "
                                     "from here on are written to members/")
        self.member_files = list(state["member_files"])
        self.member_val_files = list(state.get("member_val_files", []))
        self.ensemble = CachedEnsemble([ctx.predictions.load(name) for name in self.member_files],
                                       [ctx.predictions.load(name) for name in self.member_val_files])
