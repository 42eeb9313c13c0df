"""Score the starting weights without training: the "SGD" column of the paper's ImageNet table.

``train.py`` uses it whenever ``trainer.epochs=0`` (whatever ``method`` says), so that
``python run.py experiment=table2_resnet50 trainer.epochs=0`` evaluates the pretrained network with
the same loaders and metrics (top-1, top-5, NLL, ECE) as the fine-tuned ones. The starting weights
must be trained ones (``model.pretrained`` or ``trainer.init_from``): scoring a random
initialisation is refused, since it is never what was meant.
"""

from __future__ import annotations

from swalab.evaluate import ModelPredictor, Predictor
from swalab.methods.base import Method, TrainContext


class Pretrained(Method):
    """No training step; one predictor, ``pretrained``: the model as it was loaded."""

    name = "pretrained"

    def __init__(self):
        super().__init__(schedule=None, budget=0.0)  # no schedule: nothing is trained

    def validate(self, epochs: int, initialized: bool) -> None:
        if epochs != 0:
            raise ValueError(f"scoring the starting weights trains nothing: trainer.epochs must be 0, got {epochs}")
        if not initialized:
            raise ValueError("trainer.epochs=0 scores the starting weights, but they are a random initialisation: "
                             "set model.pretrained=true (timm models) or trainer.init_from=<run or weights file>")

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        return 0.0

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {"pretrained": ModelPredictor(ctx.model, ctx.device, ctx.amp)}
