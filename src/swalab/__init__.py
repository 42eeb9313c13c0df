"""swalab: weight averaging (SWA, EMA) and fast ensembling (FGE) for PyTorch, configured with Hydra."""

from swalab.config import register_resolvers

register_resolvers()

__version__ = "0.1.0"
