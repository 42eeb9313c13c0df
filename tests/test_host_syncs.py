"""A training step and a BN-update batch make no host sync (bench/host_syncs.py counts them the same way).

A host sync stops the Python thread until the GPU has finished its queue; in the training step it would leave
the GPU idle every step. Every sync torch can cause there is an operator the CPU profiler records too (a read of
one value into Python is ``aten::_local_scalar_dense``; a boolean mask is ``aten::nonzero``), so these tests count
them on the CPU: zero per step of SGD and of EMA with the progress bar left to its default off a terminal (SLURM,
nohup: tqdm hands back a disabled bar, not None), and zero per batch of the BN update. A shown bar reads the loss
for its postfix every 10 steps, which the same count sees: the counting works.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re

import pytest
import torch

from swalab.data import DataSplit, ResidentLoader
from swalab.evaluate import recompute_bn
from swalab.methods import EMA, SGD
from swalab.models import PreResNet
from swalab.schedules import Constant
from swalab.trainer import Trainer, TrainerOptions

CPU = torch.device("cpu")
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::unique", "aten::_unique2", "aten::masked_select")
STEPS, WARMUP = 20, 2


def syncs(events) -> int:
    return sum(e.name in SYNC_OPS for e in events)


def profiled_steps(tmp_path, method_class, progress: bool | None, heartbeat_minutes: float = 0, **kwargs) -> int:
    """Syncs over ``STEPS`` whole step cycles of ``Trainer.fit`` (after ``WARMUP`` steps), from one method hook's end to
    the next: data, forward, backward, optimizer, the method's own update, the loop's bookkeeping and bar."""
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    class Marked(method_class):
        def on_step_end(self, ctx, epoch, step):
            super().on_step_end(ctx, epoch, step)
            if step + 1 == WARMUP:
                profiler.start()
            if step + 1 == WARMUP + STEPS:
                profiler.stop()

    g = torch.Generator().manual_seed(0)
    split = DataSplit(torch.randint(0, 256, (8 * (STEPS + WARMUP), 3, 8, 8), generator=g, dtype=torch.uint8),
                      torch.arange(8 * (STEPS + WARMUP)) % 10)
    common = dict(device=CPU, mean=(0.5,) * 3, std=(0.25,) * 3)
    train = ResidentLoader(split, 8, train=True, drop_last=True, pad=1, **common)
    test = ResidentLoader(split, 64, train=False, **common)
    torch.manual_seed(0)
    trainer = Trainer(PreResNet(depth=8, num_classes=10, in_channels=3), Marked(Constant(lr=0.01), 1, **kwargs),
                      train, test, test, CPU, tmp_path, TrainerOptions(epochs=1, eval_every=0, progress=progress,
                                                                      handle_signals=False,
                                                                      heartbeat_minutes=heartbeat_minutes))
    with contextlib.redirect_stderr(io.StringIO()):  # off a terminal
        trainer.fit()
    return syncs(profiler.events())


@pytest.mark.parametrize("method_class, kwargs", [(SGD, {}), (EMA, {"decay": 0.99})], ids=["sgd", "ema"])
def test_a_training_step_off_a_terminal_makes_no_host_sync(tmp_path, method_class, kwargs):
    assert profiled_steps(tmp_path, method_class, None, **kwargs) == 0


def test_a_heartbeat_line_due_at_every_step_reads_nothing_from_the_device(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="swalab"):
        assert profiled_steps(tmp_path, SGD, None, heartbeat_minutes=1e-9) == 0
    assert sum(" step " in r.getMessage() for r in caplog.records) >= STEPS


def test_a_shown_bar_reads_the_loss_every_10_steps_which_the_count_sees(tmp_path):
    assert profiled_steps(tmp_path, SGD, True) == 2 * STEPS // 10  # loss.item() and the accuracy's float()


def test_a_bn_update_batch_makes_no_host_sync_where_torchs_makes_one_per_layer():
    from torch.optim.swa_utils import update_bn

    torch.manual_seed(0)
    model = PreResNet(depth=8, num_classes=10, in_channels=3)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    batches = [(torch.randn(8, 3, 8, 8), None) for _ in range(4)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ours:
        recompute_bn(model, batches, CPU)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        update_bn(batches, model)  # momentum None: BatchNorm reads num_batches_tracked on every batch
    assert syncs(ours.events()) == 0
    assert syncs(theirs.events()) == len(layers) * len(batches) == 7 * 4


def test_no_bar_is_made_off_a_terminal():
    from swalab.logs import progress_bar

    with contextlib.redirect_stderr(io.StringIO()):
        assert progress_bar(0, 1, 2, 0, None, show=None) is None

def test_off_a_terminal_a_long_epoch_says_every_n_minutes_its_epoch_step_elapsed_and_eta(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="swalab"):
        profiled_steps(tmp_path, SGD, None, heartbeat_minutes=1e-9)
    beats = [r.getMessage() for r in caplog.records if " step " in r.getMessage()]
    steps = STEPS + WARMUP
    assert re.fullmatch(rf"epoch 1/1  step 1/{steps}  elapsed \d+s  ETA \d+s", beats[0]), beats[0]
    assert beats[-1].startswith(f"epoch 1/1  step {steps - 1}/{steps}")  # none after the last step: the epoch line


def test_no_heartbeat_line_when_none_is_due_or_a_bar_is_shown(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="swalab"):
        profiled_steps(tmp_path / "a", SGD, None, heartbeat_minutes=60)
        profiled_steps(tmp_path / "b", SGD, None, heartbeat_minutes=0)
        with contextlib.redirect_stderr(io.StringIO()):
            profiled_steps(tmp_path / "c", SGD, True, heartbeat_minutes=1e-9)
    assert not [r.getMessage() for r in caplog.records if " step " in r.getMessage()]
