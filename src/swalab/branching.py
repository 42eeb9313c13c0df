"""Branching: continue another run's checkpoint, with its full state, as a new run of another method.

When to use it: a row of the paper's Table 1 (SGD, FGE, SWA at 1, 1.25 and 1.5 budgets) shares
its first epochs. SWA starts from the SGD run "stopped early without modifying the learning rate
schedule" (paper section 3.2) and FGE from a pretrained checkpoint of the same SGD run, so both
can *branch* off one SGD trunk instead of re-training the shared epochs.

``run.branch_from=<trunk run dir>@<epoch>`` restores what a resume restores (weights,
optimizer momentum, every RNG state, the history up to that epoch, the epoch counter) into a new
run directory with its own config. Only the method's own state starts fresh, which is what a
straight-through run of the child's config holds at that epoch provided that

* the epoch is at most ``method.last_branch_epoch()`` (the method has averaged or collected
  nothing yet: the epoch before averaging starts for constant-lr SWA, the end of pretraining for FGE), and
* the child's learning rate agrees with the trunk's on every epoch before it (``check_branch``
  replays the child's ``step_lr`` against the ``lr`` column of the trunk's history).

Both are checked before training, so a branch either equals the straight-through run or is
refused with the reason. The trunk checkpoint's identity (``swalab.identity``) must equal the
child's on every key but what only the method decides (``identity.method_part``: the method, its recipe block,
the run's length) and the schedule, whose effect before the branch point the lr replay checks: another data set, model,
seed, batch size, training subset, optimizer or loss is refused, naming the keys. Plain ``model.init_from`` is different: it copies weights only (momentum and
RNG are lost) and suits fine-tuning, not reproducing a straight-through run.

``lineage.json`` in the child records the parent (``kind: branch``); ``read_lineage`` reads it back."""

from __future__ import annotations

import json
import math
from pathlib import Path

from swalab.checkpoint import CheckpointStore, damaged_says_what_to_do, read_checkpoint
from swalab.identity import differences, method_part
from swalab.rundir import RunDir, WeightSpec


class BranchError(ValueError):
    """A branch that would not equal the straight-through run; the message says why and what to change."""


def parse_spec(spec: str) -> tuple[Path, int]:
    """``<run dir>@<epoch>`` -> (run dir, epoch). The epoch is required: a branch point is explicit."""
    weights = WeightSpec.parse(spec)
    if weights.epoch is None or weights.name:
        raise BranchError(f"run.branch_from={spec!r} must be <run dir>@<epoch>, e.g. outputs/.../seed0@112")
    return weights.path, weights.epoch


def find_checkpoint(run_dir: Path, epoch: int) -> Path:
    """The trunk's checkpoint after ``epoch`` whole epochs: ``checkpoints/saved/`` first, then the last two."""
    found = CheckpointStore(run_dir).find(epoch)
    if found is not None:
        return found
    raise FileNotFoundError(f"run.branch_from={run_dir}@{epoch}: no checkpoint of epoch {epoch} in "
                            f"{run_dir / 'checkpoints'} (the trunk keeps it for good with run.save_at=[{epoch}]; "
                            "a finished trunk that kept none is skipped by its command: move it away, or use another "
                            "paths.output_dir, and train it again)")


def load_branch_state(spec: str, identity: dict) -> tuple[dict, dict]:
    """The trunk's checkpoint as a resume state for the child, and the child's lineage record.

    The method state is dropped (``None``), so the child's method starts fresh; the identities must
    match on everything but what only the method decides and the schedule (module doc)."""
    parent, epoch = parse_spec(spec)
    path = find_checkpoint(parent, epoch)
    state = damaged_says_what_to_do(read_checkpoint, path, f"run.branch_from={spec}",
                                    "branch from another epoch the trunk kept (run.save_at), or train the trunk again")
    if int(state.get("step", 0)) != 0 or int(state["epoch"]) != epoch:
        raise BranchError(f"{path} was written mid-epoch; a branch starts at an epoch boundary")
    trunk = dict(state.get("identity") or {})
    free = [k for k in {*identity, *trunk} if method_part(k) or k == "schedule" or k.startswith("schedule.")]
    diffs = differences(identity, trunk, ignore=free)
    if diffs:
        raise BranchError(f"run.branch_from={spec}: {path} belongs to another experiment (" + "; ".join(diffs[:8])
                          + "). A branch may change only what its method decides (the method, its recipe block, the "
                          "run's length) and the schedule")
    state = {**state, "method": None, "path": str(path)}
    lineage = {"kind": "branch", "parent": str(parent), "checkpoint": str(path), "epoch": epoch,
               "parent_method": trunk.get("method.name"), "parent_epochs": trunk.get("trainer.epochs")}
    return state, lineage


def check_branch(method, state: dict, steps_per_epoch: int) -> None:
    """Refuse a branch that would not equal a straight-through run of the child's config (see module doc)."""
    epoch, epochs = int(state["epoch"]), method.epochs
    if epoch >= epochs:
        raise BranchError(f"run.branch_from at epoch {epoch} leaves nothing to train (trainer.epochs={epochs})")
    limit = method.last_branch_epoch()
    if epoch > limit:
        raise BranchError(f"method {method.name} holds state of its own after epoch {limit} (e.g. SWA's first capture "
                          f"is after the epoch averaging starts), so a branch at epoch {epoch} would miss it: branch at epoch "
                          f"{limit} or earlier (keep it with run.save_at in the trunk)")
    for row in state["history"][:epoch]:
        e = int(row["epoch"]) - 1
        mine = method.step_lr(e, steps_per_epoch - 1, steps_per_epoch)
        if not math.isclose(mine, float(row["lr"]), rel_tol=1e-9, abs_tol=1e-12):
            raise BranchError(f"the trunk trained epoch {e + 1} at lr {row['lr']:.6g} but this run would use "
                              f"{mine:.6g}: the schedules differ before the branch point. For SWA use "
                              "model.swa.pre_schedule=base and schedule.horizon=<the trunk's trainer.epochs>")


def read_lineage(run_dir: str | Path) -> dict | None:
    """The run's ``lineage.json`` (``kind`` ``branch``, or absent for a weights-only ``init_from``), if any."""
    path = Path(run_dir) / RunDir.LINEAGE
    return json.loads(path.read_text()) if path.exists() else None
