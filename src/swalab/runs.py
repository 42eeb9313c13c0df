"""Open a finished (or interrupted) run directory again: its config, model, weights and data.

Evaluators, reports and analyses all need the same thing: "give me run X's network with its
SWA / EMA / live weights and the loaders it was trained and tested on". ``load_run`` rebuilds
them from the run's own resolved ``config.yaml`` exactly as ``train.py`` does (same
``instantiate`` calls, the same ``build_loaders``), so a model is scored on the data it was
trained for, with the normalisation it was trained with.

    run = load_run("outputs/cifar10/preresnet20/swa/default/seed0")
    swa = run.model_for("swa")                  # a copy of the network with the SWA weights
    probs = run.probs(swa)                      # its softmax on the run's test set
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim.swa_utils import update_bn

import swalab  # noqa: F401  (registers the config resolvers)
from swalab.evaluate import autocast_for, labels_of, predict_logits
from swalab.methods.fge import MEMBER_PROBS_FILE
from swalab.train import build_loaders, build_model, load_into
from swalab.trainer import select_device


@dataclass
class LoadedRun:
    """A run directory brought back to life. Built by :func:`load_run`.

    ``model`` holds the live (last-iterate) weights of ``final.pt`` (or of the newest checkpoint
    when the run did not finish); ``weights`` maps each method's own model (``"swa"``, ``"ema"``)
    to its state dict, BN statistics included as they were scored.
    """

    run_dir: Path
    cfg: DictConfig
    device: torch.device
    model: nn.Module
    weights: dict[str, dict[str, torch.Tensor]]
    train_loader: object
    test_loader: object
    bn_loader: object
    metrics: dict = field(default_factory=dict)
    amp: bool = False

    @property
    def method(self) -> str:
        return str(self.cfg.method.name)

    @property
    def label(self) -> str:
        """A short name for tables: ``<method>[-<budget>B]/seed<seed>``."""
        return f"{self.method}/seed{self.cfg.seed}"

    def model_for(self, name: str) -> nn.Module:
        """A copy of the network carrying the weights of ``name`` (``"live"`` or a key of ``weights``)."""
        if name == "live":
            return self.model
        if name not in self.weights:
            raise KeyError(f"{self.run_dir} has no {name!r} weights in final.pt (it has: {sorted(self.weights)})")
        model = copy.deepcopy(self.model)
        load_into(model, self.weights[name], f"{self.run_dir}/final.pt[{name}]")
        return model

    def probs(self, model: nn.Module) -> torch.Tensor:
        """Softmax probabilities of ``model`` on the run's test set (CPU, float32)."""
        return predict_logits(model, self.test_loader, self.device, self.amp).softmax(dim=1)

    def test_labels(self) -> torch.Tensor:
        return labels_of(self.test_loader)

    def update_bn(self, model: nn.Module) -> None:
        """Recompute ``model``'s BN statistics over the run's BN-update data, as the trainer does."""
        if hasattr(self.bn_loader, "set_epoch"):
            self.bn_loader.set_epoch(0)
        with autocast_for(self.device, self.amp):
            update_bn(self.bn_loader, model, device=self.device)

    def member_paths(self) -> list[Path]:
        """FGE members saved with ``method.save_members=true``, in the order they were collected."""
        return sorted((self.run_dir / "members").glob("member_*.pt"))

    def member_model(self, path: Path) -> nn.Module:
        model = copy.deepcopy(self.model)
        load_into(model, torch.load(path, map_location="cpu", weights_only=False)["model"], str(path))
        return model.to(self.device)

    def cached_member_probs(self) -> list[torch.Tensor] | None:
        """The FGE members' test probabilities cached at the end of training (None when absent)."""
        path = self.run_dir / MEMBER_PROBS_FILE
        if not path.exists():
            return None
        return list(torch.load(path, map_location="cpu", weights_only=False)["member_probs"])


def read_config(run_dir: str | Path) -> DictConfig:
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a swalab run directory (no config.yaml)")
    return OmegaConf.load(path)


def _final_state(run_dir: Path) -> dict:
    final = run_dir / "final.pt"
    if final.exists():
        return torch.load(final, map_location="cpu", weights_only=False)
    from swalab.checkpoint import load_latest

    state = load_latest(run_dir / "checkpoints")
    if state is None:
        raise FileNotFoundError(f"{run_dir} holds neither final.pt nor a checkpoint")
    return {"model": state["model"], "methods": {}}


def load_run(run_dir: str | Path, device: str = "auto", data=None) -> LoadedRun:
    """Rebuild run ``run_dir``'s model (live weights loaded), method weights, loaders and device.

    ``data`` may pass an already loaded ``ImageData`` to share between runs of the same data set
    (the caller is responsible that it is the one the run's config names).
    """
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    dev = select_device(device)
    if data is None:
        data = instantiate(cfg.dataset.source)
    train_loader, test_loader, bn_loader = build_loaders(cfg, data, dev)
    model = build_model(cfg, data)
    state = _final_state(run_dir)
    load_into(model, state["model"], f"{run_dir}/final.pt")
    model.to(dev).eval()
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    return LoadedRun(run_dir=run_dir, cfg=cfg, device=dev, model=model, weights=dict(state.get("methods") or {}),
                     train_loader=train_loader, test_loader=test_loader, bn_loader=bn_loader, metrics=metrics,
                     amp=bool(cfg.trainer.amp) and dev.type == "cuda")
