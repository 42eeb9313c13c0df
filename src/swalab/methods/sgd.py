"""Conventional SGD: the paper's baseline. Everything it needs is the base class's default."""

from swalab.methods.base import Method


class SGD(Method):
    """Train with the base schedule alone; the last iterate is the ``sgd`` predictor."""

    name = "sgd"

    def last_branch_epoch(self) -> int:
        return self.epochs  # no state of its own: any epoch of an SGD trunk can be continued as SGD
