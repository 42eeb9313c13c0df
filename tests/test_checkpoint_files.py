"""``swalab.checkpoint`` file by file: a full disk met through torch's writer, the checkpoints a run keeps for good
(branching and the loss plane read them), and the prediction files a resume reads back. Most of these came from
mutation testing of the module (docs/mutation.md): each fails on an edit of the rule it names."""

from __future__ import annotations

import errno
import signal
from pathlib import Path

import pytest
import torch

from swalab import faults
from swalab.checkpoint import (FORMAT, VERSION, CheckpointError, CheckpointStore, PredictionFiles, atomic_save,
                              load_latest, read_checkpoint)


def full_disk_inside_torch(obj, f):
    """What torch's zip writer does on a full disk: a RuntimeError raised while handling the OSError."""
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0") from None


def full_disk_as_cause(obj, f):
    raise RuntimeError("writer failed") from OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("save", [full_disk_inside_torch, full_disk_as_cause])
def test_a_full_disk_reported_by_torch_is_named_and_the_earlier_file_stays(tmp_path, monkeypatch, save):
    path = atomic_save({"epoch": 1}, tmp_path / "epoch0001.pt")
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError) as raised:
        atomic_save({"epoch": 2}, path)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value) == (f"[Errno {errno.ENOSPC}] cannot write {path} (No space left on device); nothing was "
                                 f"replaced, so the earlier files in {tmp_path} are intact. Free space (or point "
                                 "paths.output_dir elsewhere) and re-launch the same command to continue")
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch0001.pt"]  # no temp file left


def test_an_error_with_no_os_error_behind_it_is_raised_as_it_was(tmp_path, monkeypatch):
    def broken(obj, f):
        raise RuntimeError("not a disk problem")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="^not a disk problem$"):
        atomic_save({"epoch": 1}, tmp_path / "epoch0001.pt")


def store_with_epochs(tmp_path, *epochs, keep=2):
    store = CheckpointStore(tmp_path, keep=keep)
    for epoch in epochs:
        store.save({"epoch": epoch}, epoch)
    return store


def test_a_checkpoint_kept_for_good_outlives_the_rolling_deletion_and_is_found_first(tmp_path):
    store = store_with_epochs(tmp_path, 1, 2)
    saved = store.keep_for_good(1)
    assert saved == tmp_path / "checkpoints" / "saved" / "epoch0001.pt"
    assert saved.stat().st_ino == (tmp_path / "checkpoints" / "epoch0001.pt").stat().st_ino  # a link, not a copy
    store.save({"epoch": 3}, 3)
    store.save({"epoch": 4}, 4)
    assert not (tmp_path / "checkpoints" / "epoch0001.pt").exists()
    assert store.find(1) == saved and torch.load(saved, weights_only=False)["epoch"] == 1
    assert store.find(4) == tmp_path / "checkpoints" / "epoch0004.pt"
    assert store.find(2) is None  # rolled away, never kept


def test_keeping_an_epoch_twice_replaces_the_saved_copy_with_a_hard_link(tmp_path):
    store = store_with_epochs(tmp_path, 1)
    store.keep_for_good(1)
    store.save({"epoch": 1, "again": True}, 1)  # the epoch written anew (a resumed run)
    saved = store.keep_for_good(1)
    assert torch.load(saved, weights_only=False).get("again") is True
    assert saved.stat().st_ino == (tmp_path / "checkpoints" / "epoch0001.pt").stat().st_ino  # no second copy


def test_where_no_hard_link_can_be_made_the_checkpoint_is_copied(tmp_path, monkeypatch):
    store = store_with_epochs(tmp_path, 1)

    def no_links(self, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(Path, "hardlink_to", no_links)
    saved = store.keep_for_good(1)
    assert saved.read_bytes() == (tmp_path / "checkpoints" / "epoch0001.pt").read_bytes()
    assert saved.stat().st_ino != (tmp_path / "checkpoints" / "epoch0001.pt").stat().st_ino


def test_kept_lists_each_epoch_boundary_once_saved_or_rolling_never_a_mid_epoch_one(tmp_path):
    store = store_with_epochs(tmp_path, 1, 2, keep=3)
    store.keep_for_good(1)
    store.save({"epoch": 3, "step": 10}, 3, step=10)  # preempted 10 steps into epoch 4
    checkpoints = tmp_path / "checkpoints"
    assert store.kept() == [(1, checkpoints / "epoch0001.pt"), (2, checkpoints / "epoch0002.pt")]
    (checkpoints / "epoch0001.pt").unlink()
    assert store.kept() == [(1, checkpoints / "saved" / "epoch0001.pt"), (2, checkpoints / "epoch0002.pt")]


def test_a_missing_prediction_file_says_the_run_cannot_resume_and_what_to_do(tmp_path):
    files = PredictionFiles(tmp_path)
    with pytest.raises(CheckpointError) as raised:
        files.load("fge_member_001")
    assert str(raised.value).endswith("the run cannot resume without it. Move the run directory away to start the "
                                      "run afresh")


def test_an_unreadable_prediction_file_is_named_with_the_reason(tmp_path):
    files = PredictionFiles(tmp_path)
    files.save("swa@1.25", torch.zeros(2, 3))
    files.path("swa@1.25").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"^cannot read .*swa@1\.25\.pt: (UnpicklingError|RuntimeError): "):
        files.load("swa@1.25")


class NotATensor:
    pass


def test_a_prediction_file_is_read_as_tensors_only_never_as_arbitrary_objects(tmp_path):
    """Prediction files hold tensors; one holding any other pickled object is refused, so reading a run directory
    of unknown origin runs no code from it."""
    files = PredictionFiles(tmp_path)
    files.dir.mkdir(parents=True)
    torch.save(NotATensor(), files.path("fge_member_001"))
    with pytest.raises(CheckpointError, match="cannot read .*fge_member_001.pt: UnpicklingError: "):
        files.load("fge_member_001")
    assert torch.equal(files.load(files.save("ok", torch.ones(2))), torch.ones(2))


def test_a_prediction_name_with_characters_a_file_name_should_not_hold_is_refused_saying_which(tmp_path):
    with pytest.raises(ValueError, match=r"^prediction name 'a/b': use letters, digits and _ \. @ \+ - only$"):
        PredictionFiles(tmp_path).path("a/b")


def test_the_newest_readable_checkpoint_is_loaded_skipping_a_torn_one_with_a_warning_naming_it(tmp_path):
    store = store_with_epochs(tmp_path, 1, 2, 3, keep=3)
    torn = tmp_path / "checkpoints" / "epoch0003.pt"
    torn.write_bytes(torn.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match=rf"^cannot read checkpoint {torn}: [A-Za-z]+Error: .*; falling back to "
                                            "the previous"):
        state = load_latest(store.dir)
    assert (state["epoch"], state["path"]) == (2, str(tmp_path / "checkpoints" / "epoch0002.pt"))
    assert load_latest(tmp_path / "none") is None


def test_when_every_checkpoint_is_torn_the_run_is_refused_saying_what_to_do(tmp_path):
    store = store_with_epochs(tmp_path, 1)
    (store.dir / "epoch0001.pt").write_bytes(b"torn")
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointError) as raised:
        load_latest(store.dir)
    assert str(raised.value) == (f"no readable checkpoint in {store.dir}: every one is corrupt. Move the directory "
                                 "away to start the run afresh.")


@pytest.mark.parametrize("state, says", [
    ({"epoch": 1}, "is not a swalab checkpoint (no 'swalab-checkpoint' marker)"),
    ("not a dict", "is not a swalab checkpoint (no 'swalab-checkpoint' marker)"),
])
def test_a_file_that_is_no_swalab_checkpoint_is_refused_by_name(tmp_path, state, says):
    path = atomic_save(state, tmp_path / "epoch0001.pt")
    with pytest.raises(CheckpointError, match=f"^{path} {says.replace('(', '[(]').replace(')', '[)]')}$"):
        read_checkpoint(path)


def test_a_checkpoint_of_another_version_names_both(tmp_path):
    path = atomic_save({"format": FORMAT, "version": VERSION + 1}, tmp_path / "epoch0001.pt")
    with pytest.raises(CheckpointError, match=f"^{path} has checkpoint version {VERSION + 1}, this swalab reads "
                                              f"{VERSION}$"):
        read_checkpoint(path)


def test_a_checkpoint_of_another_config_or_of_none_is_refused_naming_the_keys_and_the_remedy(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"identity": {"seed": 0, "model.lr": 0.1}}, 1)
    path = store.dir / "epoch0001.pt"
    assert load_latest(store.dir, {"seed": 0, "model.lr": 0.1})["identity"] == {"seed": 0, "model.lr": 0.1}
    assert load_latest(store.dir)["path"] == str(path)  # no identity to check against: taken as it is
    with pytest.raises(CheckpointError) as raised:
        load_latest(store.dir, {"seed": 1, "model.lr": 0.1})
    assert str(raised.value) == (f"checkpoint {path} belongs to a run of another config (seed: 0 there, 1 here). "
                                 "Choose another directory with run.dir=<dir>, or move this one away.")
    store.save({}, 2)
    with pytest.raises(CheckpointError) as raised:
        load_latest(store.dir, {"seed": 0})
    assert str(raised.value) == (f"checkpoint {store.dir / 'epoch0002.pt'} carries no run identity (written by an "
                                 "older swalab): move the run directory away to start the run afresh")


def test_a_ctrl_c_while_torch_handles_a_disk_error_stays_a_ctrl_c(tmp_path, monkeypatch):
    def interrupted(obj, f):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"epoch": 1}, tmp_path / "epoch0001.pt")


def test_a_cause_chain_that_loops_ends_the_search_for_a_disk_error(tmp_path, monkeypatch):
    """Python's own chaining never loops, but a library may set ``__context__`` by hand: the search must end."""
    def looped(obj, f):
        first, second = RuntimeError("first"), RuntimeError("second")
        first.__context__, second.__context__ = second, first
        raise first

    def too_long(signum, frame):
        raise TimeoutError("the search for an OSError went round the loop")

    monkeypatch.setattr(torch, "save", looped)
    previous = signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(RuntimeError, match="^first$"):
            atomic_save({"epoch": 1}, tmp_path / "epoch0001.pt")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_temp_file_lies_beside_its_checkpoint_named_after_it_and_a_left_one_is_removed_by_the_next_save(
        tmp_path, monkeypatch):
    """A kill mid-write leaves ``epoch0002.pt.<random>.tmp`` beside the checkpoints (never a torn ``epoch0002.pt``,
    never a file elsewhere); the next save removes it."""
    class Killed(Exception):
        pass

    store = store_with_epochs(tmp_path, 1)
    seen_at_kill = []

    def kill(signum, frame):  # at the fault point: the temp file is written and not yet renamed
        seen_at_kill.extend(sorted(store.dir.iterdir()))
        raise Killed

    monkeypatch.setenv(faults.ENV, "checkpoint_write:1:USR1")
    faults.reset()
    previous = signal.signal(signal.SIGUSR1, kill)
    try:
        with pytest.raises(Killed):
            store.save({"epoch": 2}, 2)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen_at_kill[0] == store.dir / "epoch0001.pt" and len(seen_at_kill) == 2
    temp = seen_at_kill[1]
    assert temp.parent == store.dir and temp.name.startswith("epoch0002.pt.") and temp.name.endswith(".tmp")
    assert sorted(p.name for p in store.dir.iterdir()) == ["epoch0001.pt"]  # the handler's cleanup ran: no temp left
    temp.write_bytes(b"left by a kill -9")
    monkeypatch.delenv(faults.ENV)
    store.save({"epoch": 2}, 2)
    assert sorted(p.name for p in store.dir.iterdir()) == ["epoch0001.pt", "epoch0002.pt"]


def test_checkpoints_are_readable_by_the_group_like_every_other_output(tmp_path):
    path = atomic_save({"epoch": 1}, tmp_path / "epoch0001.pt")
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_refusal_names_at_most_eight_differing_keys_separated_by_semicolons(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({"identity": {f"k{i}": 0 for i in range(10)}}, 1)
    with pytest.raises(CheckpointError) as raised:
        store.latest({f"k{i}": 1 for i in range(10)})
    listed = str(raised.value).split("another config (")[1].split("). Choose")[0]
    assert listed == "; ".join(f"k{i}: 0 there, 1 here" for i in range(8))


def test_the_store_lists_its_rolling_checkpoints_newest_first_a_mid_epoch_one_after_its_epoch(tmp_path):
    store = store_with_epochs(tmp_path, 1, 2, keep=3)
    store.save({}, 2, step=5)
    assert [p.name for p in store.paths()] == ["epoch0002_step000005.pt", "epoch0002.pt", "epoch0001.pt"]
