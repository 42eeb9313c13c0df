"""FGE driven hook by hook on a tiny ``nn.Linear`` whose weights we set each epoch: its lr, the epochs it collects
members at, what it writes (member predictions, ``members/``), what a resume restores from this swalab's checkpoints
and from earlier ones', and its refusals at their exact boundaries. Expected values are worked out in the test."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from swalab.branching import BranchError, check_branch
from swalab.checkpoint import CheckpointError, PredictionFiles
from swalab.config import ConfigError
from swalab.methods import FGE, TrainContext
from swalab.methods.fge import member_log_probs_of
from swalab.schedules import Constant, fge_cyclic_lr
from swalab.upgrade import todays_method_state

from method_stand_ins import scores

CPU = torch.device("cpu")
X_TEST, X_VAL = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 0.0]]), torch.tensor([[-1.0, 4.0], [0.0, 1.0]])

pytestmark = pytest.mark.usefixtures("one_thread")




def weights_at(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The live model's weight and bias at the end of (0-based) ``epoch``: a different model every epoch."""
    weight = torch.arange(6, dtype=torch.float32).reshape(3, 2) * (0.3 * (epoch + 1)) - 1.0
    return weight, torch.tensor([0.1, -0.2, 0.05]) * epoch


def log_probs_at(epoch: int, x: torch.Tensor) -> torch.Tensor:
    weight, bias = weights_at(epoch)
    return (x @ weight.T + bias).log_softmax(1)


def make_ctx(model: nn.Module, run_dir, val: bool, **kw) -> TrainContext:
    kw.setdefault("update_bn", lambda m: None)
    if val:
        kw.update(val_log_probs=scores(X_VAL), val_labels=torch.tensor([1, 2]))
    return TrainContext(model=model, device=CPU, epochs=1, steps_per_epoch=1, run_dir=run_dir,
                        test_log_probs=scores(X_TEST), test_labels=torch.tensor([0, 1, 2]), **kw)


def run_epochs(method: FGE, ctx: TrainContext, epochs) -> None:
    for epoch in epochs:
        weight, bias = weights_at(epoch)
        with torch.no_grad():
            ctx.model.weight.copy_(weight)
            ctx.model.bias.copy_(bias)
        method.on_epoch_end(ctx, epoch)


def fge(epochs: int = 5, **kw) -> FGE:
    kw.setdefault("pretrain_epochs", 1)
    return FGE(Constant(lr=0.1), epochs, lr_max=0.05, lr_min=0.01, cycle_epochs=kw.pop("cycle_epochs", 2), **kw)


def mean_log_probs(members: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([m.exp() for m in members]).mean(0).log()


# ----------------------------------------------------------------------------- the lr


def test_fge_trains_at_the_base_schedules_lr_while_pretraining_then_on_its_triangular_cycle():
    method = FGE(Constant(lr=0.3), 11, lr_max=0.05, lr_min=0.01, cycle_epochs=4, pretrain_epochs=3)
    for epoch in range(11):
        for step in range(4):
            expected = 0.3 if epoch < 3 else fge_cyclic_lr(epoch - 3, step / 4, 0.05, 0.01, 4)
            assert method.lr_at(epoch, step, 4) == pytest.approx(expected, rel=1e-12), (epoch, step)
    # by hand: each cycle starts at lr_max, reaches lr_min at its middle, and climbs back
    assert method.lr_at(3, 0, 4) == pytest.approx(0.05) and method.lr_at(7, 0, 4) == pytest.approx(0.05)
    assert method.lr_at(5, 0, 4) == pytest.approx(0.01)
    assert method.lr_at(4, 2, 4) == pytest.approx(0.05 * 0.25 + 0.01 * 0.75)  # 3/8 of the cycle


# ----------------------------------------------------------------------------- collection, caveats, branching


@pytest.mark.parametrize("pretrain, cycle, epochs, collected_at", [
    (3, 4, 12, [5, 9]),  # 1-based epochs: the end of each cycle's first half
    (1, 2, 5, [2, 4]),
    (0, 6, 10, [3, 9]),
])
def test_fge_collects_a_member_at_the_end_of_each_cycles_first_half(tmp_path, pretrain, cycle, epochs, collected_at):
    method = fge(epochs, pretrain_epochs=pretrain, cycle_epochs=cycle)
    run_epochs(method, make_ctx(nn.Linear(2, 3), tmp_path, val=False), range(epochs))
    assert [e + 1 for e in method.member_epochs] == collected_at
    assert len(method.ensemble) == len(collected_at)


@pytest.mark.parametrize("epochs, members", [(5, 1), (8, 1), (9, 2)])
def test_fge_warns_before_the_run_when_its_ensemble_would_be_one_member(epochs, members):
    """Pretraining 3 epochs, cycles of 4: members after epochs 5, 9, 13, ..."""
    caveats = fge(epochs, pretrain_epochs=3, cycle_epochs=4).caveats()
    if members == 1:
        assert len(caveats) == 1
        for text in (f"FGE collects 1 member in trainer.epochs={epochs}", "3 of pretraining", "cycles of 4",
                     "Lengthen the run or lower method.pretrain for 2 members or more"):
            assert text in caveats[0]
    else:
        assert caveats == []


def test_fge_says_at_launch_which_schedule_keys_its_reference_pretraining_never_reads():
    from swalab.schedules import PaperSGD

    method = FGE(PaperSGD(lr=0.1, horizon=9, final_lr=0.001), 9, lr_max=0.05, lr_min=0.01, cycle_epochs=2,
                 pretrain_epochs=3, pre_schedule="reference")
    assert method.caveats() == [
        "schedule.final_lr=0.001 is not read by method=fge with method.pre_schedule=reference (the paper's shape from "
        "schedule.lr over the 3 epochs of pretraining): set method.pre_schedule=base to pretrain with the schedule "
        "group as configured"]
    method.pre_schedule = "base"
    assert method.caveats() == []


@pytest.mark.parametrize("pretrain, cycle, last", [(3, 4, 4), (0, 2, 0), (2, 6, 4)])
def test_an_fge_run_branches_at_most_from_the_epoch_before_its_first_member(pretrain, cycle, last):
    """The first member is collected at the end of 1-based epoch pretrain + cycle / 2: a branch from the trunk's
    checkpoint after that many epochs minus one still equals a straight-through run; one epoch later it does not."""
    method = fge(20, pretrain_epochs=pretrain, cycle_epochs=cycle)
    check_branch(method, {"epoch": last, "history": []}, steps_per_epoch=2)
    with pytest.raises(BranchError, match=f"after epoch {last} .*branch at epoch {last} or earlier"):
        check_branch(method, {"epoch": last + 1, "history": []}, steps_per_epoch=2)


# ----------------------------------------------------------------------------- what a member leaves behind


@pytest.mark.parametrize("val", [True, False], ids=["with-val-split", "without"])
def test_fge_keeps_each_members_test_and_validation_predictions_in_files_its_state_names(tmp_path, val):
    method = fge(5)  # pretraining 1 epoch, cycles of 2: members after 1-based epochs 2 and 4
    run_epochs(method, make_ctx(nn.Linear(2, 3), tmp_path, val=val), range(5))
    epochs = [1, 3]  # 0-based
    state = method.state_dict()
    names = ["fge_member_001", "fge_member_002"]
    assert state["member_files"] == names and state["member_epochs"] == epochs
    files = PredictionFiles(tmp_path)
    for name, epoch in zip(names, epochs):
        torch.testing.assert_close(files.load(name), log_probs_at(epoch, X_TEST))
    torch.testing.assert_close(method.ensemble.log_probs(), mean_log_probs([log_probs_at(e, X_TEST) for e in epochs]))
    if val:
        assert state["member_val_files"] == [f"{n}_val" for n in names]
        for name, epoch in zip(names, epochs):
            torch.testing.assert_close(files.load(f"{name}_val"), log_probs_at(epoch, X_VAL))
        torch.testing.assert_close(method.ensemble.val_log_proba(),
                                   mean_log_probs([log_probs_at(e, X_VAL) for e in epochs]))
    else:
        assert "member_val_files" not in state and method.ensemble.val_log_proba() is None
        assert not list((tmp_path / "checkpoints" / "predictions").glob("*_val.pt"))


def test_fge_with_bn_update_recomputes_the_live_models_statistics_before_scoring_each_member(tmp_path):
    calls = []

    def update_bn(model):  # stands in for a pass over the training data: the scored member must see its effect
        calls.append(model)
        with torch.no_grad():
            model.bias.fill_(5.0)

    model = nn.Linear(2, 3)
    method = fge(4, bn_update=True)  # members after 0-based epochs 1 and 3
    run_epochs(method, make_ctx(model, tmp_path, val=False, update_bn=update_bn), range(4))
    assert len(calls) == 2 and all(m is model for m in calls)
    weight, _ = weights_at(3)
    torch.testing.assert_close(PredictionFiles(tmp_path).load("fge_member_002"),
                               (X_TEST @ weight.T + 5.0).log_softmax(1))


@pytest.mark.parametrize("save_members, writes, saved", [(True, True, True), (False, True, False),
                                                          (True, False, False)],
                         ids=["asked", "not-asked", "not-the-writing-rank"])
def test_fge_saves_each_members_weights_under_members_named_by_its_epoch_only_when_asked(
        tmp_path, save_members, writes, saved):
    run_dir = tmp_path / "run"
    model = nn.Linear(2, 3)
    ctx = make_ctx(model, run_dir, val=False, predictions=PredictionFiles(run_dir, write=writes))
    method = fge(4, pretrain_epochs=1, cycle_epochs=4, save_members=save_members)  # member after epoch 2 only
    run_epochs(method, ctx, range(4))
    members = run_dir / "members"
    if not saved:
        assert not members.exists()
        return
    assert sorted(p.name for p in members.iterdir()) == ["member_001_epoch3.pt"]
    saved_member = torch.load(members / "member_001_epoch3.pt", weights_only=True)
    assert saved_member["epoch"] == 3
    weight, bias = weights_at(2)
    assert torch.equal(saved_member["model"]["weight"], weight) and torch.equal(saved_member["model"]["bias"], bias)


# ----------------------------------------------------------------------------- resuming


def test_a_resumed_fge_restores_its_members_from_the_files_its_state_names_and_goes_on(tmp_path):
    model = nn.Linear(2, 3)
    first = fge(7)
    run_epochs(first, make_ctx(model, tmp_path, val=True), range(4))  # members after 0-based epochs 1, 3
    state = first.state_dict()
    resumed = fge(7)
    ctx = make_ctx(model, tmp_path, val=True)
    resumed.load_state_dict(state, ctx)
    assert resumed.member_epochs == [1, 3] and resumed.member_val_files == ["fge_member_001_val", "fge_member_002_val"]
    torch.testing.assert_close(resumed.ensemble.val_log_proba(),
                               mean_log_probs([log_probs_at(e, X_VAL) for e in (1, 3)]))
    run_epochs(resumed, ctx, range(4, 6))
    assert resumed.state_dict() == {"member_files": ["fge_member_001", "fge_member_002", "fge_member_003"],
                                    "member_epochs": [1, 3, 5],
                                    "member_val_files": ["fge_member_001_val", "fge_member_002_val",
                                                         "fge_member_003_val"]}
    for got, x in ((resumed.ensemble.log_probs(), X_TEST), (resumed.ensemble.val_log_proba(), X_VAL)):
        torch.testing.assert_close(got, mean_log_probs([log_probs_at(e, x) for e in (1, 3, 5)]))


def upgraded_and_loaded(state: dict, run_dir, val: bool) -> FGE:
    """An earlier swalab's FGE state (its members' predictions inside) as ``swalab.upgrade`` rewrites its checkpoint
    (each member's predictions written to its file, the state naming them), then loaded by today's FGE."""
    state, files, _ = todays_method_state(state)
    for name, tensor in files.items():
        PredictionFiles(run_dir).save(name, tensor)
    method = fge(7)
    method.load_state_dict(state, make_ctx(nn.Linear(2, 3), run_dir, val=val))
    return method


def test_a_checkpoint_of_an_earlier_swalab_with_member_log_probs_is_upgraded_and_resumes_with_each_members_file(
        tmp_path):
    test_members = [log_probs_at(e, X_TEST) for e in (1, 3)]
    val_members = [log_probs_at(e, X_VAL) for e in (1, 3)]
    state = {"member_log_probs": test_members, "member_val_log_probs": val_members, "member_epochs": [1, 3]}
    method = upgraded_and_loaded(state, tmp_path, val=True)
    assert method.state_dict() == {"member_files": ["fge_member_001", "fge_member_002"], "member_epochs": [1, 3],
                                   "member_val_files": ["fge_member_001_val", "fge_member_002_val"]}
    files = PredictionFiles(tmp_path)
    for k, (test, val) in enumerate(zip(test_members, val_members), start=1):
        torch.testing.assert_close(files.load(f"fge_member_{k:03d}"), test)
        torch.testing.assert_close(files.load(f"fge_member_{k:03d}_val"), val)
    torch.testing.assert_close(method.ensemble.log_probs(), mean_log_probs(test_members))
    torch.testing.assert_close(method.ensemble.val_log_proba(), mean_log_probs(val_members))


def test_a_checkpoint_that_kept_member_probabilities_is_upgraded_to_their_logs(tmp_path):
    probs = [log_probs_at(e, X_TEST).exp() for e in (1, 3)]
    method = upgraded_and_loaded({"member_probs": probs, "member_epochs": [1, 3]}, tmp_path, val=False)
    assert method.member_files == ["fge_member_001", "fge_member_002"] and method.member_epochs == [1, 3]
    torch.testing.assert_close(PredictionFiles(tmp_path).load("fge_member_002"), probs[1].log())
    torch.testing.assert_close(method.ensemble.log_probs().exp(), torch.stack(probs).mean(0))


def test_a_checkpoint_of_an_earlier_swalab_is_refused_in_one_line_naming_the_upgrade(tmp_path):
    probs = [log_probs_at(e, X_TEST).exp() for e in (1, 3)]
    with pytest.raises(CheckpointError, match=rf"FGE state of a checkpoint of {tmp_path} is in the format of an "
                                              rf"earlier swalab.*python -m swalab.upgrade {tmp_path} --write$"):
        fge(7).load_state_dict({"member_probs": probs, "member_epochs": [1, 3]},
                               make_ctx(nn.Linear(2, 3), tmp_path, val=False))
    assert not PredictionFiles(tmp_path).dir.exists()  # nothing written


def test_a_member_probs_file_of_an_earlier_swalab_is_refused_naming_the_upgrade(tmp_path):
    path = tmp_path / "fge_member_probs.pt"
    with pytest.raises(CheckpointError, match=rf"{path} is in the format of an earlier swalab"):
        member_log_probs_of({"member_probs": [torch.ones(1, 2)]}, path)


# ----------------------------------------------------------------------------- refusals at their boundaries


def refusal(**kw) -> str:
    initialized = kw.pop("initialized", True)
    with pytest.raises(ConfigError) as refused:
        FGE(Constant(lr=0.1), **kw).validate(initialized)
    return str(refused.value)


def test_fge_lr_min_may_equal_lr_max_but_not_exceed_it_naming_both_keys():
    FGE(Constant(lr=0.1), 6, lr_max=0.05, lr_min=0.05, pretrain_epochs=2).validate(False)
    message = refusal(epochs=6, lr_max=0.05, lr_min=0.051, pretrain_epochs=2)
    assert "method.lr_min=0.051 is above method.lr_max=0.05" in message and "Swap the two values" in message


def test_fge_from_random_weights_needs_pretraining_naming_both_ways_to_give_it():
    FGE(Constant(lr=0.1), 6, lr_max=0.05, lr_min=0.01, pretrain_epochs=0).validate(initialized=True)
    FGE(Constant(lr=0.1), 6, lr_max=0.05, lr_min=0.01, pretrain_epochs=1).validate(initialized=False)
    message = refusal(epochs=6, lr_max=0.05, lr_min=0.01, pretrain_epochs=0, initialized=False)
    assert ("set model.init_from=<checkpoint or run dir> or method.pretrain > 0 (a fraction of the budget trained "
            "with SGD before the cycles)") in message


def test_fge_needs_half_a_cycle_after_pretraining_refused_one_epoch_short_with_the_numbers():
    """Pretraining 3 epochs, cycles of 4: the first member comes 2 epochs after pretraining, so 5 epochs is the
    shortest run that collects one."""
    FGE(Constant(lr=0.1), 5, lr_max=0.05, lr_min=0.01, cycle_epochs=4, pretrain_epochs=3).validate(False)
    message = refusal(epochs=4, lr_max=0.05, lr_min=0.01, cycle_epochs=4, pretrain_epochs=3)
    for text in ("trainer.epochs=4 leaves 1 epoch after 3 epochs of pretraining", "fewer than half a cycle (2)",
                 "Lower method.pretrain (a fraction of the budget) or method.cycle_epochs"):
        assert text in message
