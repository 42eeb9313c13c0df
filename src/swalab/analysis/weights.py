"""Weights as vectors: flatten a state dict's *parameters*, do linear algebra, and put them back.

Every geometric analysis (planes, rays, segments) works in the space of trainable parameters.
BatchNorm buffers (``running_mean``, ``running_var``, ``num_batches_tracked``) are *not* part of
that space: a linear combination of running statistics is not the statistics of the combined
network. So :class:`ParamSpace` keeps them apart: ``flatten`` reads parameters only, and
``to_state`` rebuilds a full state dict from a vector plus the buffers of a reference state. Those
buffers are a placeholder; recompute them (``update_bn``, the analyses' ``--bn-update``) before
trusting any metric of a point that is not one of the saved solutions.

Vectors are float64 on the CPU, so that projections of nearby points (SWA iterates differ little)
keep their precision."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamSpace:
    """The ordered parameter names and shapes of a model: the coordinates of weight space."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def of(cls, model: nn.Module) -> "ParamSpace":
        items = list(model.named_parameters())
        return cls(tuple(n for n, _ in items), tuple(p.shape for _, p in items))

    @property
    def dim(self) -> int:
        return sum(int(torch.Size(s).numel()) for s in self.shapes)

    def flatten(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The parameters of ``state`` as one float64 vector (buffers ignored)."""
        missing = [n for n in self.names if n not in state]
        if missing:
            raise KeyError(f"the state dict lacks parameters {missing[:5]} (another architecture?)")
        misfit = [(n, tuple(state[n].shape), tuple(s)) for n, s in zip(self.names, self.shapes)
                  if tuple(state[n].shape) != tuple(s)]
        if misfit:
            name, theirs, ours = misfit[0]
            raise ValueError(f"parameter {name} has shape {list(theirs)} there but {list(ours)} in this network "
                             f"({len(misfit)} of {len(self.names)} parameters differ): weights of another architecture")
        return torch.cat([state[n].detach().reshape(-1).to("cpu", torch.float64) for n in self.names])

    def buffers(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Everything in ``state`` that is not a parameter (BN running statistics and counters)."""
        params = set(self.names)
        return {k: v for k, v in state.items() if k not in params}

    def to_state(self, vector: torch.Tensor, buffers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A full state dict: parameters from ``vector``, everything else copied from ``buffers``."""
        if vector.numel() != self.dim:
            raise ValueError(f"vector has {vector.numel()} entries, the model has {self.dim} parameters")
        state, start = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = int(torch.Size(shape).numel())
            state[name] = vector[start:start + n].reshape(shape).to(torch.float32).clone()
            start += n
        state.update({k: v.clone() for k, v in buffers.items()})
        return state


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def squared_norm(vector: torch.Tensor) -> float:
    return float(vector.double().pow(2).sum())


def random_unit_directions(dim: int, count: int, seed: int) -> torch.Tensor:
    """``count`` directions drawn uniformly from the unit sphere in R^dim (normalised Gaussians)."""
    g = torch.Generator().manual_seed(int(seed))
    d = torch.randn(count, dim, generator=g, dtype=torch.float64)
    return d / d.norm(dim=1, keepdim=True)
