"""Stand-ins for what the trainer lends a method (``TrainContext``'s scorers) and for its training steps, shared by
the tests that drive a method's hooks directly (tests/test_*_behaviour.py, tests/test_method_hooks.py)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def scores(x: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    """A scorer: a model's log-probabilities on the inputs ``x``."""
    def log_probs(model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(x).log_softmax(1)

    return log_probs


def weight_row(model: nn.Module) -> torch.Tensor:
    """A scorer that shows what was scored: the model's weights as one row of "log-probabilities"."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).reshape(1, -1).clone()


def fill_weights(model: nn.Module, value: float) -> None:
    """A training step's outcome, set by hand: every parameter of ``model`` equal to ``value``."""
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
