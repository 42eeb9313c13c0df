"""Score the starting weights without training: the "SGD" column of the paper's ImageNet table.

``method=pretrained`` (``conf/method/pretrained.yaml``) trains nothing, whatever ``trainer.epochs``
and ``method.budget`` say (an experiment may set them for its other methods), and scores the starting
weights through the same loaders and metrics (top-1, top-5, NLL, ECE) as the fine-tuned runs:
``python run.py experiment=table2_resnet50 method=pretrained``. The starting weights must be trained ones
(``model.pretrained`` or ``model.init_from``): scoring a random initialisation is refused, since it is
never what was meant."""

from __future__ import annotations

from swalab.config import ConfigError
from swalab.evaluate import ModelPredictor, Predictor
from swalab.methods.base import Method, TrainContext


class Pretrained(Method):
    """No training step; one predictor, ``pretrained``: the model as it was loaded."""

    name = "pretrained"
    trains = False  # its identity leaves out the optimizer, schedule, loss and trainer (swalab.identity)
    live = "pretrained"  # the loaded weights, scored as they are

    def __init__(self, schedule=None, epochs: int = 0, budget: float = 0.0, name: str | None = None):
        super().__init__(schedule, 0, budget, name)  # nothing trains: zero epochs whatever the config says

    def validate(self, initialized: bool) -> None:
        if not initialized:
            raise ConfigError("method=pretrained scores the starting weights, but they are a random initialisation: "
                              "set model.pretrained=true (timm models) or model.init_from=<run or weights file>")

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        return 0.0

    def predictors(self, ctx: TrainContext) -> dict[str, Predictor]:
        return {self.live: ModelPredictor(ctx.model, ctx.device)}
