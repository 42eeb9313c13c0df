"""Open a finished (or interrupted) run directory again: its config, data, network and saved weights.

Comparisons, reports and analyses all need the same thing: "give me run X's network with its SWA /
EMA / live weights and the data it was trained and tested on". :func:`open_run` rebuilds them from
the run's own resolved ``config.yaml`` exactly as ``swalab.train`` does (the same loader, the same
``build_model`` and ``build_loaders``), so a model is scored on the data it was trained for, with the
normalisation it was trained with. This module is the one place that knows a run directory's files.

    run = open_run("outputs/cifar10/preresnet20/swa/default/seed0")
    data = run.data()                            # the run's ImageData (optionally capped)
    model = run.model(data)                      # a fresh network of the run's architecture
    model.load_state_dict(run.weights("swa"))    # the SWA average, BN statistics as they were scored
    load_weights("<run dir>@30")                 # or any weight spec (see load_weights)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.checkpoint import CheckpointStore
from swalab.config import build
from swalab.data import ImageData, subset
from swalab.data.splits import cap_test_split
from swalab.methods.fge import MEMBER_PROBS_FILE
from swalab.train import build_loaders, build_model, load_init_weights

FINAL = "final.pt"


@dataclass
class Run:
    """A run directory and its resolved config. Built by :func:`open_run`."""

    path: Path
    cfg: DictConfig

    @property
    def method(self) -> str:
        return str(self.cfg.method.name)

    @property
    def label(self) -> str:
        """A short name for tables: ``<method>/seed<seed>``."""
        return f"{self.method}/seed{self.cfg.seed}"

    @property
    def weight_decay(self) -> float:
        """The L2 coefficient the run trained with (the paper's train loss adds wd/2 ||w||^2)."""
        return float(self.cfg.trainer.weight_decay)

    @property
    def metrics(self) -> dict:
        path = self.path / "metrics.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def data(self, train_size: int | None = None, test_size: int | None = None, seed: int = 0) -> ImageData:
        """The run's data set, optionally cut to a seeded class-stratified training subset and a capped test set
        (seed 0, as ``dataset.test_size`` caps it), for analyses that cannot afford the whole splits."""
        data: ImageData = build(self.cfg.dataset.source, "dataset.source")
        train = subset(data.train, train_size, seed) if train_size else data.train
        test = cap_test_split(data.test, test_size) if test_size else data.test
        return dataclasses.replace(data, train=train, test=test)

    def model(self, data: ImageData | None = None) -> torch.nn.Module:
        """A fresh network of the run's architecture (built for ``data``'s classes and channels)."""
        return build_model(self.cfg, data)

    def loaders(self, data: ImageData, device: torch.device, **trainer: object):
        """The run's training, test and BN-update loaders on ``device`` (``trainer`` overrides trainer keys)."""
        cfg = OmegaConf.merge(self.cfg, {"trainer": trainer}) if trainer else self.cfg
        return build_loaders(cfg, data, device)

    def weights(self, name: str = "live") -> dict[str, torch.Tensor]:
        """A state dict: ``live`` (or ``sgd``: the last iterate; the newest checkpoint's when the run has no
        ``final.pt``) or a method's own weights in ``final.pt`` (``swa``, ``ema``)."""
        final = self.path / FINAL
        if final.exists():
            state = torch.load(final, map_location="cpu", weights_only=False)
        elif name in ("live", "sgd"):
            state = CheckpointStore(self.path).latest()
            if state is None:
                raise FileNotFoundError(f"{self.path} holds neither {FINAL} nor a checkpoint")
        else:
            raise FileNotFoundError(f"{self.path} has no {FINAL} (is the run finished?)")
        if name in ("live", "sgd", "model"):
            return state["model"]
        methods = state.get("methods") or {}
        if name not in methods:
            raise KeyError(f"{self.path}: {FINAL} holds weights of {sorted(methods)} besides the live model, "
                           f"not {name!r}")
        return methods[name]

    def method_weights(self) -> list[str]:
        """The names of the method's own weights in ``final.pt`` (``["swa"]``, ``["ema"]`` or none)."""
        final = self.path / FINAL
        return sorted(torch.load(final, map_location="cpu", weights_only=False).get("methods") or {}) \
            if final.exists() else []

    def member_paths(self) -> list[Path]:
        """FGE members saved with ``method.save_members=true``, in the order they were collected."""
        return sorted((self.path / "members").glob("member_*.pt"))

    def cached_member_probs(self) -> list[torch.Tensor] | None:
        """The FGE members' test probabilities cached at the end of training (None when absent)."""
        path = self.path / MEMBER_PROBS_FILE
        if not path.exists():
            return None
        return list(torch.load(path, map_location="cpu", weights_only=False)["member_probs"])


def open_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    config = run_dir / "config.yaml"
    if not config.exists():
        raise FileNotFoundError(f"{run_dir} is not a swalab run directory: no config.yaml there")
    return Run(path=run_dir, cfg=OmegaConf.load(config))


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
    """The state dict a weight spec names:

    * ``<run dir>`` or ``<run dir>:sgd``: the live weights at the end of the run (for a SWA run, the last SGD
      iterate); ``<run dir>:swa`` (or ``:ema``): a method's own weights;
    * ``<run dir>@<epoch>``: a checkpoint kept with ``run.save_at`` (or one of the newest two);
    * a ``.pt`` file: a swalab checkpoint, a ``final.pt`` (live weights) or a plain state dict.
    """
    spec = str(spec)
    head, _, method = spec.partition(":")
    path = Path(head.split("@")[0])
    if path.is_dir() and "@" not in head:
        if not (path / FINAL).exists():
            raise FileNotFoundError(f"{spec}: {path} has no {FINAL} (is the run finished?)")
        return Run(path, OmegaConf.create({})).weights(method or "live")  # the weights need no config
    if method:
        raise ValueError(f"{spec}: ':{method}' only applies to a run directory")
    state, _ = load_init_weights(head)
    return state
