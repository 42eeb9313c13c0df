"""Load what an analysis needs from a run directory: its config, a fresh model, data and weights.

Used by every analysis command. A run directory is self-describing (``config.yaml`` is the
resolved config), so the model and the data are rebuilt exactly as the run trained them; the
loaders come from :func:`swalab.train.build_loaders`, so normalisation and augmentation match.

Weights are named by a *spec*:

* ``<run dir>`` or ``<run dir>:sgd``: the live weights at the end of the run (``final.pt["model"]``);
  for an SWA run that is the last SGD iterate of the SWA phase;
* ``<run dir>:swa`` (or ``:ema``, any key of ``final.pt["methods"]``): a method's own weights;
* ``<run dir>@<epoch>``: a checkpoint kept with ``run.save_at`` (or one of the newest two);
* a ``.pt`` file: a swalab checkpoint, a ``final.pt`` (live weights) or a plain state dict.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from swalab.data import ImageData, subset
from swalab.train import build_loaders, load_init_weights
from swalab.trainer import select_device


@dataclass
class AnalysisData:
    """Loaders for one analysis.

    ``train_eval`` and ``test`` are un-augmented, in a fixed order (for losses and errors);
    ``bn`` is the augmented training subset used to recompute BatchNorm statistics (the same pass
    ``update_bn`` makes after training). ``train_size`` / ``test_size`` are the images each holds.
    """

    train_eval: object
    test: object
    bn: object
    train_size: int
    test_size: int


@dataclass
class LoadedRun:
    """A run directory opened for analysis: the resolved config and the means to rebuild it."""

    run_dir: Path
    cfg: DictConfig

    @property
    def weight_decay(self) -> float:
        """The L2 coefficient the run trained with (the paper's train loss adds wd/2 ||w||^2)."""
        return float(self.cfg.trainer.weight_decay)

    def build_model(self) -> torch.nn.Module:
        return instantiate(self.cfg.model.arch)

    def build_data(self, device: torch.device, train_size: int | None = None, test_size: int | None = None,
                   seed: int = 0) -> AnalysisData:
        """The run's data, optionally cut to seeded class-stratified subsets (for cheap CPU analyses)."""
        data: ImageData = instantiate(self.cfg.dataset.source)
        train = subset(data.train, train_size, seed) if train_size else data.train
        test = subset(data.test, test_size, seed) if test_size else data.test
        cfg = OmegaConf.merge(self.cfg, {"trainer": {"batch_size": min(int(self.cfg.trainer.batch_size), len(train)),
                                                      "bn_update_fraction": 1.0}})
        _, test_loader, bn_loader = build_loaders(cfg, dataclasses.replace(data, train=train, test=test), device)
        # the "test" loader of build_loaders over the training images: un-augmented, fixed order
        _, train_eval, _ = build_loaders(cfg, dataclasses.replace(data, train=train, test=train), device)
        return AnalysisData(train_eval=train_eval, test=test_loader, bn=bn_loader, train_size=len(train),
                            test_size=len(test))


def load_run(run_dir: str | Path) -> LoadedRun:
    run_dir = Path(run_dir)
    config = run_dir / "config.yaml"
    if not config.exists():
        raise FileNotFoundError(f"{run_dir} is not a swalab run directory: no config.yaml there")
    return LoadedRun(run_dir=run_dir, cfg=OmegaConf.load(config))


def run_of(spec: str) -> Path | None:
    """The run directory a weight spec points into, if any (to find the config and data)."""
    path = Path(str(spec).split("@")[0].split(":")[0])
    if path.is_dir():
        return path
    for parent in path.parents:  # <run>/final.pt, <run>/checkpoints/[saved/]epochNNNN.pt
        if (parent / "config.yaml").exists():
            return parent
    return None


def load_weights(spec: str) -> dict[str, torch.Tensor]:
    """The state dict a weight spec names (see the module docstring)."""
    spec = str(spec)
    head, _, method = spec.partition(":")
    path = Path(head.split("@")[0])
    if path.is_dir() and "@" not in head:
        final = path / "final.pt"
        if not final.exists():
            raise FileNotFoundError(f"{spec}: {path} has no final.pt (is the run finished?)")
        state = torch.load(final, map_location="cpu", weights_only=False)
        if method in ("", "sgd", "model"):
            return state["model"]
        methods = state.get("methods", {})
        if method not in methods:
            raise KeyError(f"{spec}: final.pt holds weights of {sorted(methods)} besides the live model, "
                           f"not {method!r}")
        return methods[method]
    if method:
        raise ValueError(f"{spec}: ':{method}' only applies to a run directory")
    state, _ = load_init_weights(head)
    return state


def pick_device(name: str) -> torch.device:
    return select_device(name)


def add_common_arguments(parser) -> None:
    """The options every analysis command shares (output, data subset, device, BN handling)."""
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--quiet", action="store_true", help="no per-point progress lines")
    parser.add_argument("--train-size", type=int, default=None,
                        help="score on a seeded, class-stratified subset of this many training images "
                             "(also used for the BN update); default: the run's whole training set")
    parser.add_argument("--test-size", type=int, default=None,
                        help="score on a subset of this many test images; default: the whole test set")
    parser.add_argument("--bn-update", action=argparse.BooleanOptionalAction, default=None,
                        help="recompute BatchNorm statistics at every point (default: on for models with BN)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data subsets (and random directions)")


def add_solution_arguments(parser) -> None:
    """``--run``, ``--swa``, ``--sgd``: the two solutions the rays and segment commands start from."""
    parser.add_argument("--run", required=True, help="an SWA run directory (config, data, and final.pt)")
    parser.add_argument("--swa", default=None, help="SWA weights (default: RUN:swa)")
    parser.add_argument("--sgd", default=None,
                        help="SGD weights (default: RUN:sgd, the run's last iterate; the paper compares with a "
                             "conventionally trained SGD run: pass <sgd run dir>)")


def load_solutions(args, space) -> tuple[dict[str, str], dict[str, tuple[torch.Tensor, dict]]]:
    """The SWA and SGD weight specs named by :func:`add_solution_arguments` and, for each, the flat
    parameter vector and the buffers in ``space``."""
    specs = {"swa": args.swa or f"{args.run}:swa", "sgd": args.sgd or f"{args.run}:sgd"}
    solutions = {}
    for name, spec in specs.items():
        state = load_weights(spec)
        solutions[name] = (space.flatten(state), space.buffers(state))
    return specs, solutions


def prepare(run_dir: str | Path, args):
    """Open a run for an analysis: ``(run, model, parameter space, data, bn_update, device)``."""
    from swalab.analysis.weights import ParamSpace, has_batchnorm

    run = load_run(run_dir)
    device = pick_device(args.device)
    model = run.build_model()
    data = run.build_data(device, args.train_size, args.test_size, seed=args.seed)
    bn_update = has_batchnorm(model) if args.bn_update is None else bool(args.bn_update)
    return run, model.to(device), ParamSpace.of(model), data, bn_update, device
