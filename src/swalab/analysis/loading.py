"""What an analysis needs from a run directory: its network, parameter space, data and weights.

Used by every analysis command. The run is opened with :func:`swalab.results.runs.open_run` (the one owner of
run directories), which rebuilds the model and the data exactly as the run trained them; weight specs
(``<run dir>[:swa]``, ``<run dir>@<epoch>``, a ``.pt`` file) are read by :func:`swalab.runweights.load_weights`.
A :class:`Study` gathers what every command shares: the options, the loaders, a :class:`Probe` factory
and the settings recorded with each result log."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from swalab.analysis.probe import Probe
from swalab.analysis.weights import ParamSpace, has_batchnorm
from swalab.config import ConfigError
from swalab.results.runs import Run, open_run
from swalab.distributed import select_device
from swalab.rundir import WeightSpec
from swalab.runweights import load_weights

__all__ = ["AnalysisData", "Study", "open_study", "add_common_arguments",
           "add_solution_arguments", "load_solutions", "flat",
           "solution_names"]


@dataclass
class AnalysisData:
    """Loaders for one analysis.

    ``train_eval`` and ``test`` are un-augmented, in a fixed order (for losses and errors);
    ``bn`` is the augmented training subset used to recompute BatchNorm statistics (the same pass
    ``update_bn`` makes after training). ``train_size`` / ``test_size`` are the images each holds."""

    train_eval: object
    test: object
    bn: object
    train_size: int
    test_size: int


def analysis_data(run: Run, device: torch.device, train_size: int | None = None, test_size: int | None = None,
                  seed: int = 0) -> AnalysisData:
    """The run's data, optionally cut to subsets (for cheap CPU analyses), as the three loaders an analysis uses."""
    import dataclasses

    data = run.data(train_size, test_size, seed)
    settings = dict(batch_size=min(int(run.cfg.trainer.batch_size), len(data.train)), bn_update_fraction=1.0)
    _, test_loader, bn_loader = run.loaders(data, device, **settings)
    # the "test" loader of build_loaders over the training images: un-augmented, fixed order
    _, train_eval, _ = run.loaders(dataclasses.replace(data, test=data.train), device, **settings)
    return AnalysisData(train_eval=train_eval, test=test_loader, bn=bn_loader, train_size=len(data.train),
                        test_size=len(data.test))


@dataclass
class Study:
    """One analysis of one run: its network, the network's parameter space, the data, and the shared options."""

    run: Run
    model: torch.nn.Module
    space: ParamSpace
    data: AnalysisData
    bn_update: bool
    device: torch.device
    seed: int

    def settings(self, weights: dict[str, str], out: Path, **own) -> dict:
        """A result log's settings: the weight specs (their paths relative to ``out``, so that the same weights typed
        from another folder, or as ``./run/``, are the same setting), the command's own, and what every analysis
        records (so a resumed log refuses to mix points computed on other data or with another BN handling)."""
        return {**{name: WeightSpec.parse(spec).relative_to(out) for name, spec in weights.items()}, **own,
                "train_size": self.data.train_size, "test_size": self.data.test_size, "bn_update": self.bn_update,
                "seed": self.seed}

    def probe(self, buffers: dict[str, torch.Tensor]) -> Probe:
        """Metrics at any parameter vector, with ``buffers`` (BN statistics) unless they are recomputed."""
        return Probe(self.model, self.space, buffers, self.data, self.device, self.run.weight_decay, self.bn_update)

    def describe(self) -> str:
        """``<model> on <data set> (<n> train / <m> test images, BN updated)``, for figure titles."""
        bn = ", BN updated" if self.bn_update else ""
        return (f"{self.run.cfg.model.name} on {self.run.cfg.dataset.name} ({self.data.train_size} train / "
                f"{self.data.test_size} test images{bn})")


def open_study(run_dir: str | Path, args) -> Study:
    """Open a run for an analysis with the options of :func:`add_common_arguments`; ``--out`` is checked first, as
    every tool checks where it writes before any work (``swalab.cli.output_folder``)."""
    from swalab.cli import output_folder

    output_folder(args.out, "--out")
    run = open_run(run_dir)
    device = select_device(args.device, "--device")
    data = analysis_data(run, device, args.train_size, args.test_size, seed=args.seed)
    model = run.model(run.data()).to(device)  # the data's channels and classes: a folder's config may leave them null
    bn_update = has_batchnorm(model) if args.bn_update is None else bool(args.bn_update)
    return Study(run=run, model=model, space=ParamSpace.of(model), data=data, bn_update=bn_update, device=device,
                 seed=args.seed)


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
        solutions[name] = (flat(space, state, f"--{name} {spec}", f"--run {args.run}"), space.buffers(state))
    return specs, solutions


def solution_names(args) -> dict[str, str]:
    """What the figures call the two solutions: SWA and SGD, or what ``--swa`` / ``--sgd`` named instead (``EMA`` for
    ``<run>:ema``, ``epoch 12`` for ``<run>@12``, a weights file by its name)."""
    def name(spec: str | None, default: str) -> str:
        if spec is None:
            return default
        weights = WeightSpec.parse(spec)
        if weights.name:
            return weights.name.upper()
        if weights.epoch is not None:
            return f"epoch {weights.epoch}"
        return default if weights.path.is_dir() else weights.path.name
    return {"swa": name(args.swa, "SWA"), "sgd": name(args.sgd, "SGD")}


def flat(space, state: dict, given: str, run: str) -> torch.Tensor:
    """``state``'s parameters as ``space``'s vector; weights of another network refused naming where they were
    ``given`` (``--w2 <spec>``) and the ``run`` whose network it must be."""
    try:
        return space.flatten(state)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{given}: {exc.args[0]}; every solution must be a network of {run}") from None
