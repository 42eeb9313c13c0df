"""Shared pieces of the benchmarks: machine description, models from conf/model, data, timing.

Every benchmark prints one JSON object and writes it to ``bench/results/<name>_<device>.json`` together
with the machine it ran on and its provenance (``provenance``: the commit, whether the working tree had
changes to tracked files when it started, the exact command line, the load average at start and the CPU
model), so committed numbers always say where they came from. A benchmark started from a tree with
uncommitted changes refuses to write its result (the commit would not be the code that ran) unless
``SWALAB_BENCH_ALLOW_DIRTY=1`` says so, and then the file records ``"dirty": true``. Timings on a shared
machine are noisy: the benchmarks interleave what they compare (A, B, A, B, ...) inside one process and
report medians, so a burst of load from another job hits both sides alike.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from swalab.data import DataSplit, ResidentLoader
from swalab.methods.sgd import SGD
from swalab.schedules import Constant
from swalab.trainer import Trainer, TrainerOptions

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SHARED_DATA = Path(os.environ.get("SWALAB_SHARED_DATA", ROOT.parent / "shared" / "data"))  # ../shared/data beside the repo
DEFAULT_DATA = str(SHARED_DATA / "cifar10-jpg")
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)  # conf/dataset/cifar10.yaml
CIFAR_STD = (0.2023, 0.1994, 0.2010)
CIFAR_MODELS = ("preresnet20", "preresnet110", "preresnet164", "vgg16", "wrn28_10", "pyramidnet272",
                "shakeshake26_2x64d")


# -- machine ---------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _start() -> dict:
    """What is true when a benchmark starts (this module is imported first): commit, tree, command, load."""
    # results the benchmarks write (bench/results/) are not code: gpu_suite.sh's later stages run after earlier ones
    # rewrote tracked JSONs there, and would otherwise count the tree as dirty and refuse to write
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    argv = [Path(sys.argv[0]).as_posix(), *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "command": "python " + shlex.join(argv) if argv else None, "load_average_at_start": load,
            "cpu": cpu_model()}


START = _start()


def provenance() -> dict:
    """Where the numbers came from (module doc): taken when the benchmark started."""
    return dict(START)


def machine_info(device: torch.device) -> dict:
    """What the numbers depend on: CPU, cores, load, library versions, accelerator."""
    import torchvision

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "env_OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
            "device": str(device), "device_name": "cpu"}
    info["load_average_at_start"] = START["load_average_at_start"]
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    info["git_commit"], info["git_dirty"] = START["commit"], START["dirty"]
    return info


def paper_sgd_trainer(model, method, train, test, bn, device, run_dir, weight_decay: float, **options) -> Trainer:
    """A ``Trainer`` with SGD at the paper's momentum 0.9 and ``weight_decay``, on this tree's API or on an earlier
    commit's (before the optimizer group the trainer took momentum and weight decay in its options): the benchmarks
    that compare this tree with a baseline commit run the same child code on both."""
    try:
        from swalab.optim import OptimizerSpec
    except ImportError:  # a baseline commit from before conf/optimizer
        opts = TrainerOptions(momentum=0.9, weight_decay=weight_decay, **options)
        return Trainer(model, method, train, test, bn, device, run_dir, opts)
    opts = TrainerOptions(**options)
    return Trainer(model, method, train, test, bn, device, run_dir, opts,
                   optimizer=OptimizerSpec(settings={"momentum": 0.9, "weight_decay": weight_decay}))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# Folders named by an environment variable where a benchmark runs (the GPU machine's $OUT, the staged data),
# written as the variable in a result, longest value first.
PATH_VARIABLES = ("OUT", "SWALAB_CIFAR10_JPG", "SWALAB_SHARED_DATA", "HOME")


def portable(value):
    """``value`` with every path beside the repository written relative to its root (``../shared/data/...``), and a
    folder one of ``PATH_VARIABLES`` names written as the variable (``$OUT/suite``, ``$SWALAB_CIFAR10_JPG``, ``~``):
    committed results name no absolute path of the machine they were measured on."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, str):
        value = value.replace(f"{ROOT}/", "").replace(f"{ROOT.parent}/", "../")
        named = {name: os.environ.get(name, "").rstrip("/") for name in PATH_VARIABLES}
        for name, folder in sorted(named.items(), key=lambda item: -len(item[1])):
            if len(folder) > 1:
                value = re.sub(rf"{re.escape(folder)}(?=/|\b|$)", "~" if name == "HOME" else f"${name}", value)
        return value
    return value


class DirtyTree(SystemExit):
    """A benchmark run from a working tree with uncommitted changes: its numbers belong to no commit."""


def write_result(name: str, device: torch.device, payload: dict, out: str | None = None) -> Path:
    """Print ``payload`` (with its ``provenance``) as JSON and write it to ``bench/results/<name>_<device type>.json``
    (or ``out``); refused from a dirty tree unless ``SWALAB_BENCH_ALLOW_DIRTY=1`` (module doc)."""
    payload = {**payload, "provenance": provenance()}
    text = json.dumps(portable(payload), indent=2, default=float)
    print(text)
    if START["dirty"] and os.environ.get("SWALAB_BENCH_ALLOW_DIRTY") != "1":
        raise DirtyTree(f"[bench] not written: the working tree had uncommitted changes when {name} started, so "
                        f"commit {START['commit']} is not the code that ran. Commit first, or set "
                        "SWALAB_BENCH_ALLOW_DIRTY=1 to write it marked dirty")
    path = Path(out) if out else RESULTS / f"{name}_{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of ``fn()``, with the device drained before and after."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


# -- models and data ---------------------------------------------------------------------------------------
def build_model(name: str, num_classes: int = 10, channels: int = 3) -> torch.nn.Module:
    """The network of ``conf/model/<name>.yaml``, built as ``train.py`` builds it."""
    arch = OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml").arch
    cfg = OmegaConf.create({"dataset": {"num_classes": num_classes, "channels": channels}, "arch": arch})
    return instantiate(cfg.arch)


def random_split(n: int, seed: int = 0, size: int = 32, num_classes: int = 10) -> DataSplit:
    g = torch.Generator().manual_seed(seed)
    return DataSplit(torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8),
                     torch.randint(0, num_classes, (n,), generator=g))


def image_folder_files(root: str, n: int, split: str = "train") -> list[tuple[str, int]]:
    """The first ``n / 10`` files (sorted) of every class of ``root/<split>``: a balanced fixed subset."""
    from swalab.data.folder import list_image_folder

    classes, files = list_image_folder(Path(root), max_per_class=max(1, -(-n // 10)))
    return files[split][: n] if len(classes) == 10 else files[split]


def load_split(root: str | None, n: int, split: str = "train") -> tuple[DataSplit, str]:
    """``n`` real CIFAR-10 images from the JPEG folder when it is there, else random pixels (same shapes)."""
    if root and Path(root, split).is_dir():
        from swalab.data.folder import decode_split

        return decode_split(image_folder_files(root, n, split)), f"{root} ({split}, first {n} files by class)"
    return random_split(n), "random uint8 pixels (no data folder found)"


# -- driving the real Trainer --------------------------------------------------------------------------
class TimedSGD(SGD):
    """Plain SGD at a constant lr that stamps the clock after chosen optimizer steps.

    ``Trainer`` calls ``on_step_end`` right after ``optimizer.step()``, so the stamps bracket exactly the
    steps the trainer runs (data, forward, backward, update, bookkeeping). On CUDA the device is drained at
    the two stamps only, leaving the loop free to run ahead in between as it does in a real run.
    """

    def __init__(self, lr: float, warmup: int):
        super().__init__(Constant(lr=lr), epochs=1)
        self.warmup = warmup
        self.stamps: list[float] = []

    def on_train_start(self, ctx) -> None:
        self.stamps = []

    def on_step_end(self, ctx, epoch: int, step: int) -> None:
        if step + 1 == self.warmup or step + 1 == ctx.steps_per_epoch:
            sync(ctx.device)
            self.stamps.append(time.perf_counter())


class TrainerBench:
    """One ``swalab.trainer.Trainer`` over ``train`` whose ``fit()`` is one timed epoch of ``steps`` steps.

    Build once, then call :meth:`run` per round: the (optionally compiled) model is reused across rounds.
    """

    def __init__(self, model: torch.nn.Module, train: DataSplit, batch_size: int, device: torch.device,
                 warmup: int, precision: str = "auto", channels_last: bool = True, compile: bool | str = False,
                 lr: float = 0.05, deterministic: bool = True, cuda_graphs: str = "auto"):
        steps = len(train) // batch_size
        if steps <= warmup:
            raise ValueError(f"{len(train)} images at batch {batch_size} give {steps} steps: need more than "
                             f"warmup={warmup}")
        common = dict(device=device, mean=CIFAR_MEAN, std=CIFAR_STD, channels_last=channels_last)
        loader = ResidentLoader(train, batch_size, train=True, drop_last=True, **common)
        test = ResidentLoader(DataSplit(train.images[:batch_size], train.labels[:batch_size]), batch_size,
                              train=False, **common)
        self.method = TimedSGD(lr, warmup)
        self.tmp = tempfile.TemporaryDirectory(prefix="swalab-bench-")
        self.trainer = paper_sgd_trainer(model, self.method, loader, test, loader, device, self.tmp.name,
                                         weight_decay=5e-4, epochs=1, precision=precision, channels_last=channels_last,
                                         compile=compile, eval_every=0, checkpoint_every=10**6, progress=False,
                                         handle_signals=False, deterministic=deterministic,
                                         **({} if cuda_graphs == "auto" else {"cuda_graphs": cuda_graphs}))
        self.batch_size, self.steps, self.warmup = batch_size, steps, warmup

    def run(self) -> float:
        """One epoch through ``Trainer.fit``; returns images/s over the steps after the warmup."""
        self.trainer.history.clear()
        self.trainer.fit()
        t0, t1 = self.method.stamps
        return (self.steps - self.warmup) * self.batch_size / (t1 - t0)

    def step_seconds(self, images_per_s: float) -> float:
        return self.batch_size / images_per_s
