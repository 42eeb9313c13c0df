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

# The built-in methods in the order reports show their columns; a method of one's own stands after them, unlisted.
REPORT_ORDER = (Pretrained, SGD, FGE, SWA, SWAG, EMA, LaplaceMethod)


def columns_of(method: Method | type[Method]) -> tuple[str, ...]:
    """The predictors a report shows as ``method``'s columns (``Method.columns``, else the one of its name)."""
    return method.columns or (method.name,)


def column_rank(predictor: str) -> int:
    """Where ``predictor``'s column stands among the methods of a report or a row (``swa@1.25`` is SWA's): the
    built-in methods' columns in ``REPORT_ORDER``, then every other method's, told apart by the caller."""
    order = [column for method in REPORT_ORDER for column in columns_of(method)]
    family = predictor.split("@")[0]
    return order.index(family) if family in order else len(order)
