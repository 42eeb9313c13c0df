"""What scoring under bf16 autocast would report, against the float32 scoring swalab does, on real ImageNet weights.

Before issue 31 the test passes and BN updates ran under the training autocast (bf16 on CUDA with
``trainer.amp``), so logits were rounded to bf16 before they became metrics. swalab now scores in float32
whatever the training precision (``swalab.precision.scoring_precision``). This measures the difference the old
way made: ``tf_efficientnet_lite0`` with its ImageNet weights (``../shared/data/weights``) on a fixed
class-stratified subset of imagenette's validation images (``dataset.test_size``'s rule, seed 0), scored once by
``swalab.evaluate.predict_logits`` (float32, what a run reports) and once with the same forward passes under
``torch.autocast("cpu", dtype=torch.bfloat16)`` (what a bf16-trained run reported before; torch's CPU autocast
rounds as its CUDA autocast does, in software on a CPU without bf16 instructions). Reported: accuracy, NLL,
ECE, Brier of both, and how many top-1 predictions differ.

Usage::

    python bench/bf16_scoring.py --images 800
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import SHARED_DATA, machine_info, write_result  # noqa: E402

from swalab.data.imagenet import StreamLoader, imagenet_transforms, load_imagenet  # noqa: E402
from swalab.evaluate import metrics_from_log_probs, predict_logits  # noqa: E402
from swalab.models.timm_models import create_timm_model  # noqa: E402

MODEL = "tf_efficientnet_lite0"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(SHARED_DATA / "imagenette"))
    p.add_argument("--weights", default=str(SHARED_DATA / "weights" / f"{MODEL}.in1k.pth"))
    p.add_argument("--images", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    cpu = torch.device("cpu")
    model = create_timm_model(MODEL, pretrained_file=args.weights).eval()
    _, test_tf, _ = imagenet_transforms(MODEL)
    split = load_imagenet(args.root, test_size=args.images).test.with_transform(test_tf)
    loader = StreamLoader(split, args.batch_size, train=False, num_workers=args.workers)
    labels = split.labels
    t = time.perf_counter()
    fp32 = predict_logits(model, loader, cpu)
    fp32_s = time.perf_counter() - t
    t = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = torch.cat([model(x).float() for x, _ in loader])
    bf16_s = time.perf_counter() - t
    scored = {"float32": metrics_from_log_probs(fp32.log_softmax(1), labels),
              "bf16_autocast": metrics_from_log_probs(bf16.log_softmax(1), labels)}
    changed = int((fp32.argmax(1) != bf16.argmax(1)).sum())
    payload = {"benchmark": "bf16_scoring",
               "command": "python bench/bf16_scoring.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": machine_info(cpu),
               "settings": {"model": MODEL, "weights": args.weights, "data": f"{args.root}/val",
                            "images": len(split), "subset": "class-stratified, seed 0 (dataset.test_size's rule)",
                            "batch_size": args.batch_size},
               "metrics": scored, "top1_predictions_changed": changed,
               "max_abs_logit_difference": float((fp32 - bf16).abs().max()),
               "seconds": {"float32": fp32_s, "bf16_autocast": bf16_s}}
    write_result("bf16_scoring", cpu, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
