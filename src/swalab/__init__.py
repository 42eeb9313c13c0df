"""swalab: weight averaging (SWA, EMA) and fast ensembling (FGE) for PyTorch, configured with Hydra."""

from swalab.config import register_resolvers
from swalab.settings import register_settings

register_resolvers()
register_settings()

__version__ = "0.1.0"
