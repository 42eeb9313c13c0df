"""The ``trainer`` and ``run`` config groups: each setting defined, typed, commented and checked here, once.

When: Hydra composes the groups from these classes (stored in its ConfigStore as the ``default`` that
``conf/config.yaml`` selects, on import of ``swalab``), so a value of the wrong type is refused while composing
(:func:`typed_errors` says so in swalab's words first); ``swalab.train`` instantiates them, which checks each range
(``problems``), and hands the loop both as :class:`TrainerOptions`. A setting given as an integer or a fraction is
typed ``Any``: a run's identity holds it as typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, get_type_hints

from swalab.config import ConfigError, check_avg_device, compile_mode, invalid_config, is_int, require


class InvalidSettings(ConfigError):
    """Every bad value of the settings at once (``swalab.config.check_config`` lists them with the rest)."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__(invalid_config(errors))


def problem(check: Callable, *args, **kwargs) -> str | None:
    """What ``check(*args)`` refuses (``swalab.config.require``, say), or None."""
    try:
        check(*args, **kwargs)
    except ConfigError as exc:
        return str(exc)
    return None


class Checked:
    """Settings checked when made (``__post_init__``): every bad value that ``problems`` names at once."""

    def __post_init__(self) -> None:
        errors = [p for p in self.problems() if p]
        if errors:
            raise InvalidSettings(errors)


@dataclass
class TrainerSettings(Checked):
    """The training loop: its length, batches, precision and gradient handling: what a run computes (the optimizer
    is conf/optimizer, the loss conf/loss). How and where it runs is :class:`RunSettings`."""

    epochs: Any = "${swalab.epochs:${method.budget},${model.budget_epochs}}"  # total epochs: method.budget x the model's budget B. Set it directly for a run of any length: B then follows the run (B = trainer.epochs / method.budget). Checked by the method
    batch_size: int = 128           # training batch size (the paper's)
    precision: str = "auto"         # training steps: auto (bf16 autocast on CUDA, float32 elsewhere) | bf16 | fp16 (with a gradient scaler, for GPUs without bf16) | fp32; test passes and BN updates always run in float32 (checked by swalab.precision)
    clip_grad_norm: Any = None      # clip the gradients' global norm to this before each optimizer step (null: no clipping)
    accumulate: int = 1             # split each batch into this many micro-batches (less memory), one optimizer step per batch of trainer.batch_size
    bn_update_fraction: Any = 1.0   # fraction of the training set used to recompute BN statistics of averaged models (1.0: the paper's whole-set pass; 0.05 to 0.5 scored within 0.1 points of it on PreResNet-164, 0.1 to 0.5 on PreResNet-20 trained on 10k images, bench/README.md; a few batches give poor statistics)
    nonfinite: str = "stop"         # NaN/Inf loss: stop (keep last good checkpoint) | skip (drop the step, up to max_skips)
    max_skips: int = 10             # with nonfinite=skip, how many bad steps are tolerated

    def problems(self) -> list[str | None]:
        return [problem(require, "trainer.batch_size", self.batch_size, "int", 1),
                problem(require, "trainer.clip_grad_norm", self.clip_grad_norm, "number?", 0, low_open=True),
                problem(require, "trainer.accumulate", self.accumulate, "int", 1),
                problem(require, "trainer.bn_update_fraction", self.bn_update_fraction, "number", 0, 1, low_open=True),
                problem(require, "trainer.max_skips", self.max_skips, "int", 0),
                None if self.nonfinite in ("stop", "skip") else
                f"trainer.nonfinite={self.nonfinite!r} must be 'stop' or 'skip'"]


@dataclass
class RunSettings(Checked):
    """How and where a run runs, never what it computes: no key of this group is part of a run's identity
    (swalab.identity), so changing one never makes another run. What a run computes is in the other groups."""

    dir: Optional[str] = None       # the run directory; null: <paths.output_dir>/<name made from the config> (README, "The run directory")
    resume: Any = "auto"            # auto: continue an interrupted run / skip a finished one | true (must resume) | false (only into a new directory)
    branch_from: Optional[str] = None  # continue another run's checkpoint with its full state (optimizer, RNG, history) as a new run: <run dir>@<epoch> (docs/branching.md)
    save_at: List[int] = field(default_factory=list)  # epochs whose checkpoints are kept for good, for branching with run.branch_from=<run>@<epoch>
    checkpoint_every: int = 1       # epochs between checkpoints
    snapshots: Any = None           # the live weights (fp32, no optimizer) written to <run>/snapshots/ for averages built after training (python -m swalab.posthoc, docs/posthoc.md): null (none) | N (the end of every N-th epoch) | 1/k of an epoch (0.5: twice per epoch, 0.25, 0.1)
    powerema: List[float] = field(default_factory=list)  # EDM2's power-function EMAs (Karras et al. 2024) of the live weights, tracked every step and written into every snapshot (needs run.snapshots), for python -m swalab.posthoc --powerema to rebuild any width: [] (none) | relative widths sigma_rel, e.g. [0.05,0.10] (the paper's). Changes no trained weight; two more copies of the weights on the training device and in each snapshot
    keep_checkpoints: int = 2       # newest checkpoints kept (a corrupt newest falls back to the one before)
    keep_finished_checkpoints: bool = False  # keep those newest checkpoints once the run has finished; false: deleted after metrics.json (final.pt holds the finished weights; run.save_at's stay). docs/reliability.md, 'What a run directory holds'
    device: str = "auto"            # auto (CUDA when present, else CPU) | cpu | cuda | cuda:N (checked by swalab.distributed)
    progress: Optional[bool] = None  # progress bar: null (only on an interactive terminal) | true | false
    heartbeat_minutes: Any = 5      # where no bar is shown (a grid, nohup, SLURM): a line on stdout and in run.log every N minutes within an epoch (epoch, step/steps, elapsed in the epoch, the run's ETA); 0: none. Reads the clock only, never the device
    eval_every: int = 1             # score the live model on the test set every N epochs into history.jsonl (0: only at the end)
    eval_split: str = "test"        # the split that per-epoch monitoring scores (the live model, SWA's model.swa.score_every): test | val (the validation split, dataset.val_size: history.jsonl then holds val_acc/val_loss instead of test_acc/test_loss). Final metrics score both
    temperature_scaling: Any = "auto"  # score each predictor <name> again as <name>+ts at a temperature fitted on the validation split: auto (when dataset.val_size holds one) | true (refused without one) | false. Changes no weight; a finished run is not scored again
    eval_batch_size: Optional[int] = None  # batch size of the test passes; null: 1000 on CUDA, 128 on CPU (where batches of 1000 run 2.1x slower: bench/results/eval_batch_preresnet20_cpu.json)
    channels_last: bool = True      # channels_last memory format for model and batches (CUDA and CPU; faster convolutions on both)
    deterministic: bool = True      # on CUDA: deterministic cuDNN/torch algorithms, so a run (and its resume) repeats itself bit for bit; false lets cuDNN autotune (faster, not repeatable). CPU runs are deterministic either way (swalab/precision.py, docs/reliability.md)
    cuda_graphs: str = "auto"       # on CUDA: the training step captured once as a CUDA graph and replayed (the paper's CIFAR models are launch-bound at batch 128): auto (graph it wherever it can be, else train eagerly and say why in run.log) | on (refuse where it cannot) | off. The same numbers as eager training (swalab/graphed.py)
    compile: Any = False            # torch.compile the model: false | true (its default mode) | a mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs. Under a mode without CUDA graphs of its own (default, max-autotune-no-cudagraphs) run.cuda_graphs captures the compiled step; the two with their own train without swalab's graph. Compiling takes tens of seconds per process; fused kernels round differently from eager ones
    cache_dir: Optional[str] = None  # where decoded images and file digests are cached; null: $XDG_CACHE_HOME/swalab (~/.cache/swalab), never the data folder
    download: bool = True           # fetch a named data set (CIFAR's pickles) into dataset.root when it is not there (needs internet)
    num_workers: int = 2            # DataLoader worker processes per loader of a streaming data set (ImageNet); raise it to the cores you can spare
    prefetch_factor: Optional[int] = None  # batches each worker prepares ahead; null: torch's default (2)
    avg_device: str = "train"       # where SWA's average and EMA's copy live: train (the training device) | cpu (off a small GPU; the same results)

    def problems(self) -> list[str | None]:
        bools = ("keep_finished_checkpoints", "channels_last", "deterministic", "download")
        return [*(problem(require, f"run.{name}", getattr(self, name), "bool") for name in bools),
                problem(require, "run.progress", self.progress, "bool?"),
                problem(require, "run.eval_batch_size", self.eval_batch_size, "int?", 1),
                problem(require, "run.eval_every", self.eval_every, "int", 0),
                problem(require, "run.heartbeat_minutes", self.heartbeat_minutes, "number", 0),
                problem(require, "run.checkpoint_every", self.checkpoint_every, "int", 1),
                problem(require, "run.keep_checkpoints", self.keep_checkpoints, "int", 1),
                problem(require, "run.num_workers", self.num_workers, "int", 0),
                None if self.resume in ("auto", True, False) else
                f"run.resume={self.resume!r} must be auto, true or false (run.dir=<dir> names the directory)",
                None if all(is_int(e) and e >= 1 for e in self.save_at or ()) else
                f"run.save_at={list(self.save_at)!r} must be a list of epochs >= 1",
                problem(check_avg_device, self.avg_device),
                problem(compile_mode, self.compile)]


@dataclass(kw_only=True)
class TrainerOptions(TrainerSettings, RunSettings):
    """The training loop's options (``swalab.trainer.Trainer``): both groups, with the run's length as its method
    counts it. ``swalab.train`` makes them from the config; code that builds a Trainer itself passes them."""

    epochs: int                      # the run's length (the method's epochs: trainer.epochs, checked by the method)
    handle_signals: bool = True      # pause on SIGTERM/SIGUSR1/SIGUSR2 and Ctrl-C with a checkpoint (swalab.pausing)

    def problems(self) -> list[str | None]:
        return [*TrainerSettings.problems(self), *RunSettings.problems(self)]


GROUPS = {"trainer": TrainerSettings, "run": RunSettings}


def register_settings() -> None:
    """Store each group's class in Hydra's ConfigStore as ``<group>/default``, the option ``conf/config.yaml``
    selects; before Hydra composes (``swalab/__init__.py``)."""
    from hydra.core.config_store import ConfigStore

    for group, cls in GROUPS.items():
        ConfigStore.instance().store(group=group, name="default", node=cls)


WANTED = {int: "an integer", bool: "true or false", str: "a string", Optional[int]: "an integer or null",
          Optional[bool]: "true, false or null", Optional[str]: "a string or null", List[int]: "a list of integers",
          List[float]: "a list of numbers"}


def typed_errors(args: list[str]) -> list[str]:
    """For each ``trainer.<key>=`` or ``run.<key>=`` among the command line's ``args`` (each value of a grid's
    ``a,b``) that its class's type refuses, a line naming the key, the value and what it takes: said before Hydra
    composes (``run.py``), which would refuse it in its own words with exit 1. A key a class lacks is Hydra's to name."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, ValidationError

    errors = []
    ours = [arg for arg in args if arg.partition(".")[0] in GROUPS and "=" in arg]  # not +added, not ~deleted
    for override in OverridesParser.create().parse_overrides(ours):
        group, _, name = override.key_or_group.partition(".")
        types = get_type_hints(GROUPS[group])
        for value in (override.sweep_iterator() if override.is_sweep_override() else [override.value()]
                      ) if name in types else ():
            try:
                setattr(OmegaConf.structured(GROUPS[group]), name, value)
            except ValidationError:
                errors.append(f"{group}.{name}={value!r} must be {WANTED.get(types[name], 'of another type')}")
    return errors
