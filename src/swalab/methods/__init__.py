"""Training methods: each a small strategy object the shared trainer calls through hooks."""

from swalab.methods.base import Method, TrainContext
from swalab.methods.ema import EMA
from swalab.methods.fge import FGE
from swalab.methods.laplace import LaplaceMethod
from swalab.methods.sgd import SGD
from swalab.methods.pretrained import Pretrained
from swalab.methods.swa import SWA
from swalab.methods.swag import SWAG

__all__ = ["Method", "TrainContext", "SGD", "SWA", "FGE", "EMA", "Pretrained", "SWAG", "LaplaceMethod"]
