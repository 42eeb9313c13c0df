"""Images/s of the ImageNet training loader (decode JPEG + RandomResizedCrop + flip + normalise) on the CPU.

The loader alone, no model: it answers "how many workers keep a GPU fed?". Reads real ImageNet images
(imagenette/train, 224x224 JPEGs; full ImageNet images average about 400x350, so expect somewhat less per
worker there) through ``swalab.data.imagenet.StreamLoader`` exactly as ``dataset=imagenet`` builds it.

    python bench/imagenet_loader.py --root ../shared/data/imagenette --images 768 --workers 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from _common import SHARED_DATA, machine_info, median, write_result
from swalab.data.imagenet import StreamLoader, imagenet_transforms, load_imagenet


def images_per_second(loader: StreamLoader, epoch: int) -> float:
    loader.set_epoch(epoch)
    t = time.perf_counter()
    n = sum(int(y.shape[0]) for _, y in loader)
    return n / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(SHARED_DATA / "imagenette"))
    p.add_argument("--model", default="resnet50.tv_in1k", help="timm name whose pretrained config sets the transform")
    p.add_argument("--images", type=int, default=768, help="training images per pass (a fixed seeded subset)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=None, help="crop size (default: the model's, 224)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=2, help="timed passes per worker count (after one warm-up pass)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    torch.set_num_threads(1)  # as in a worker process; the main process only collates
    data = load_imagenet(args.root, train_size=args.images, seed=0)
    train_tf, _, config = imagenet_transforms(args.model, image_size=args.image_size)
    split = data.train.with_transform(train_tf)
    rows = []
    for workers in args.workers:
        loader = StreamLoader(split, args.batch_size, train=True, seed=0, num_workers=workers)
        images_per_second(loader, 0)  # warm-up: worker start, page cache
        rates = [images_per_second(loader, 1 + r) for r in range(args.rounds)]
        rows.append({"workers": workers, "images_per_s": median(rates), "rounds": rates})
        del loader
    payload = {"benchmark": "imagenet_loader", "command": "python " + " ".join(sys.argv), "machine": machine_info(torch.device("cpu")),
               "root": args.root, "images": len(split), "batch_size": args.batch_size,
               "transform": {"model": args.model, "input_size": config["input_size"],
                             "interpolation": config["interpolation"]},
               "results": rows}
    write_result("imagenet_loader", torch.device("cpu"), payload, args.out)


if __name__ == "__main__":
    main()
