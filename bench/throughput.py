"""Training throughput (images/s): swalab's Trainer + ResidentLoader against a reference-style pipeline.

The reference pipeline is what the SWA reference code (and most CIFAR code) runs: a map-style dataset
that opens each image with PIL and applies ``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``,
``ToTensor()`` and ``Normalize`` per image, a ``DataLoader`` with worker processes, fp32, and a plain
loop that reads ``loss.item()`` and the correct count every step. swalab's side is
``swalab.trainer.Trainer.fit`` itself (ResidentLoader, channels_last, bf16 autocast on CUDA,
optionally ``torch.compile``), timed from inside by a method hook. Both train the same network on the
same files on the same machine; the two are interleaved (A, B, A, B, ...) and medians are compared.

Usage (CPU, the committed numbers)::

    python bench/throughput.py --device cpu --model preresnet20 --images 1536 --batch-size 128 --rounds 3

GPU (targets: PreResNet-164 and WRN-28-10 >= 3x)::

    python bench/throughput.py --device cuda --model wrn28_10 --images 12800 --batch-size 128 --workers 4
    python bench/throughput.py --device cuda --model preresnet164 --images 12800 --compile

``--data`` may point at the JPEG image folder (``train/<class>/*``) or at a folder holding torchvision's
``cifar-10-batches-py`` pickles (the reference then decodes nothing, as with the original CIFAR).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (CIFAR_MEAN, CIFAR_STD, DEFAULT_DATA, TrainerBench, build_model, image_folder_files,  # noqa: E402
                     machine_info, median, pick_device, write_result)

from swalab.data import DataSplit  # noqa: E402
from swalab.data.folder import decode_split  # noqa: E402

CPU_TARGET = 1.5   # swalab / reference on CPU, small model, JPEG copy
GPU_TARGET = 3.0   # swalab / reference on GPU, PreResNet-164 and WRN-28-10


class FileListDataset(torch.utils.data.Dataset):
    """``torchvision.datasets.ImageFolder`` restricted to a list of files: PIL open + RGB + transform."""

    def __init__(self, files: list[tuple[str, int]], transform):
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path, label = self.files[i]
        with Image.open(path) as im:
            return self.transform(im.convert("RGB")), label


def reference_dataset(root: str, n: int):
    """The reference CIFAR training set with the reference transforms, and the same images for swalab."""
    import torchvision
    import torchvision.transforms as T

    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(CIFAR_MEAN, CIFAR_STD)])
    if Path(root, "cifar-10-batches-py").is_dir():
        full = torchvision.datasets.CIFAR10(root, train=True, transform=transform, download=False)
        data = torch.utils.data.Subset(full, range(n))
        split = DataSplit(torch.from_numpy(full.data[:n]).permute(0, 3, 1, 2).contiguous(),
                          torch.tensor(full.targets[:n], dtype=torch.int64))
        return data, split, "pickles"
    files = image_folder_files(root, n)
    return FileListDataset(files, transform), decode_split(files), "jpeg"


class ReferenceBench:
    """The reference loop: DataLoader with workers, fp32, ``.item()`` bookkeeping every step."""

    def __init__(self, model: torch.nn.Module, dataset, batch_size: int, workers: int, device: torch.device,
                 warmup: int, lr: float = 0.05):
        self.model, self.device, self.warmup, self.batch_size = model.to(device), device, warmup, batch_size
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                                  pin_memory=device.type == "cuda", drop_last=True,
                                                  persistent_workers=workers > 0)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
        self.steps = len(self.loader)

    def run(self, batches=None) -> float:
        """One epoch; with ``batches`` (tensors already in memory) the same loop without the DataLoader."""
        self.model.train()
        loss_sum, correct, t0 = 0.0, 0, None
        for step, (x, y) in enumerate(self.loader if batches is None else batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            out = self.model(x)
            loss = F.cross_entropy(out, y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            loss_sum += loss.item() * x.size(0)
            correct += out.argmax(1).eq(y).sum().item()
            if step + 1 == self.warmup:
                t0 = time.perf_counter()
        return (self.steps - self.warmup) * self.batch_size / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--model", default="preresnet20", help="a conf/model name")
    p.add_argument("--data", default=DEFAULT_DATA, help="JPEG image folder or folder with cifar-10-batches-py")
    p.add_argument("--images", type=int, default=1536, help="training images per timed epoch (a fixed subset)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2, help="reference DataLoader workers (reference code: 4)")
    p.add_argument("--warmup", type=int, default=2, help="steps per epoch not timed (workers starting, caches)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved A/B rounds; medians are reported")
    p.add_argument("--compile", action="store_true", help="torch.compile the swalab model (Trainer option)")
    p.add_argument("--no-amp", action="store_true", help="swalab side in fp32 on CUDA too")
    p.add_argument("--no-channels-last", action="store_true", help="swalab side in the default (NCHW) layout")
    p.add_argument("--out", default=None, help="result file (default bench/results/throughput_<device>.json)")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    torch.manual_seed(0)

    dataset, split, fmt = reference_dataset(args.data, args.images)
    ref = ReferenceBench(build_model(args.model), dataset, args.batch_size, args.workers, device, args.warmup)
    ours = TrainerBench(build_model(args.model), split, args.batch_size, device, args.warmup,
                        precision="fp32" if args.no_amp else "auto", channels_last=not args.no_channels_last, compile=args.compile)
    # The reference loop fed from batches already decoded and augmented in memory: what the reference would
    # reach with a free data pipeline, so swalab's gain splits into data pipeline and compute (layout, compile).
    in_memory = [tuple(b) for b, _ in zip(ref.loader, range(ref.steps))]
    rows = []
    for r in range(args.rounds):
        rows.append({"round": r, "swalab": ours.run(), "reference": ref.run(),
                     "reference_in_memory_batches": ref.run(in_memory)})
        print(f"round {r}: swalab {rows[-1]['swalab']:.1f} img/s, reference {rows[-1]['reference']:.1f} img/s, "
              f"reference on in-memory batches {rows[-1]['reference_in_memory_batches']:.1f} img/s", file=sys.stderr)
    swalab_ips, ref_ips = median([r["swalab"] for r in rows]), median([r["reference"] for r in rows])
    ratio = swalab_ips / ref_ips
    ref_mem_ips = median([r["reference_in_memory_batches"] for r in rows])
    ratios = [r["swalab"] / r["reference"] for r in rows]
    target = GPU_TARGET if device.type == "cuda" else CPU_TARGET
    payload = {
        "benchmark": "throughput",
        "command": "python bench/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"model": args.model, "data": args.data, "data_format": fmt, "images": args.images,
                     "batch_size": args.batch_size, "workers": args.workers, "warmup_steps": args.warmup,
                     "timed_steps_per_round": ours.steps - args.warmup, "rounds": args.rounds,
                     "swalab": {"amp_bf16": device.type == "cuda" and not args.no_amp,
                                "channels_last": not args.no_channels_last, "compile": args.compile},
                     "reference": "PIL RandomCrop(32,4)+RandomHorizontalFlip+ToTensor+Normalize, DataLoader, fp32"},
        "rounds": rows,
        "swalab_images_per_s": swalab_ips,
        "reference_images_per_s": ref_ips,
        "ratio": ratio,
        "ratio_per_round_median": median(ratios),
        "reference_in_memory_images_per_s": ref_mem_ips,
        "breakdown": {"data_pipeline": ref_mem_ips / ref_ips, "compute": swalab_ips / ref_mem_ips,
                      "note": "ratio = data_pipeline x compute: the first is the most any loader could gain "
                              "over the reference's DataLoader, the second what the model step itself gained"},
        "target": {"ratio_at_least": target, "pass": ratio >= target,
                   "scope": ("GPU: PreResNet-164 and WRN-28-10" if device.type == "cuda"
                             else "CPU: small model on the JPEG copy")},
    }
    if device.type == "cuda":
        payload["swalab_epoch_seconds_50k"] = 50000 / swalab_ips
        if args.model == "wrn28_10":
            payload["target_wrn_epoch"] = {"seconds_at_most": 10.0, "pass": 50000 / swalab_ips <= 10.0}
    write_result("throughput" if args.model == "preresnet20" else f"throughput_{args.model}", device, payload,
                 args.out)
    return payload


if __name__ == "__main__":
    main()
