"""Bytes of one snapshot (``run.snapshots``, ``swalab.snapshots``) per model of ``conf/model``: the fp32 state dict
the trainer writes, parameters and buffers, no optimizer or method state. No network is trained (the size does not
depend on the values).

Usage::

    python bench/snapshot_size.py                    # every CIFAR model, with CIFAR-100's 100 classes
    python bench/snapshot_size.py --models preresnet20 --classes 10
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import CIFAR_MODELS, ROOT  # noqa: E402


def snapshot_bytes(model_name: str, classes: int) -> tuple[int, int]:
    """``(bytes of its snapshot file, parameters)`` of ``model=<model_name>`` built for ``classes`` classes."""
    from hydra import compose, initialize_config_dir

    from swalab.snapshots import fp32_weights
    from swalab.train.build import build_model

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model_name}", "dataset=cifar100",
                                                       f"dataset.num_classes={classes}"])
    model = build_model(cfg)
    buffer = io.BytesIO()
    torch.save({"epoch": 1, "step": 0, "steps_per_epoch": 1, "model": fp32_weights(model)}, buffer)
    return buffer.tell(), sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CIFAR_MODELS))
    parser.add_argument("--classes", type=int, default=100)
    args = parser.parse_args()
    print(f"{'model':<22} {'parameters':>12} {'MB per snapshot':>16}")
    for name in args.models:
        size, params = snapshot_bytes(name, args.classes)
        print(f"{name:<22} {params:>12,} {size / 1e6:>16.2f}")


if __name__ == "__main__":
    main()
