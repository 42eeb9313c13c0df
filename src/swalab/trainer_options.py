"""The training loop's settings (``swalab.trainer.Trainer``), every one explicit.

When: ``swalab.train`` fills them from ``conf/trainer`` and ``conf/run`` (each field from the key of the same
name, ``swalab.train.build.trainer_options``); code that builds a Trainer itself (tests, benchmarks, a notebook)
passes them directly. They change how a run runs, and only those named in ``swalab.identity`` what it computes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerOptions:
    """Loop settings, all explicit (``swalab.train`` fills them from ``conf/trainer`` and ``conf/run``)."""

    epochs: int
    precision: str = "auto"          # training steps' autocast: auto | bf16 | fp16 | fp32 (swalab.precision)
    clip_grad_norm: float | None = None  # clip the gradients' global norm to this before each step (None: no clipping)
    accumulate: int = 1              # micro-batches each batch is split into, one optimizer step per batch
    channels_last: bool = True       # CUDA and CPU: oneDNN convolutions are 1.1-1.4x faster in it too
    compile: bool = False
    eval_every: int = 1              # score the live model on the test set every N epochs (0: end only)
    checkpoint_every: int = 1        # epochs between checkpoints
    keep_checkpoints: int = 2
    nonfinite: str = "stop"          # stop | skip
    max_skips: int = 10
    progress: bool | None = None     # None: a bar only on an interactive terminal
    heartbeat_minutes: float = 0     # where no bar is shown: a line every N minutes within an epoch (0: none)
    deterministic: bool = True       # CUDA: deterministic algorithms, bit-equal reruns (precision.deterministic)
    cuda_graphs: str = "auto"        # CUDA: the training step captured once and replayed: auto | on | off (swalab.graphed)
    save_at: tuple[int, ...] = ()    # epochs whose checkpoints are kept for good (branching)
    handle_signals: bool = True
    eval_split: str = "test"         # the split per-epoch monitoring scores: test | val (the validation split)
    temperature_scaling: bool | str = "auto"  # <name>+ts predictors: auto (with a validation split) | True | False
    snapshots: int | float | None = None  # the live weights written to snapshots/: every N epochs, or 1/k of one (swalab.snapshots)
    powerema: tuple[float, ...] = ()  # widths sigma_rel of power-function EMAs written into every snapshot (swalab.powerema)
