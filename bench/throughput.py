"""Training throughput (images/s): swalab's Trainer + ResidentLoader against a reference-style pipeline.

The reference pipeline is what the SWA reference code (and most CIFAR code) runs: a map-style dataset
that opens each image with PIL and applies ``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``,
``ToTensor()`` and ``Normalize`` per image, a ``DataLoader`` with worker processes, fp32, and a plain
loop that reads ``loss.item()`` and the correct count every step. On CUDA it runs with
``torch.backends.cudnn.benchmark = True``, as the paper's training code sets: the reference gets cuDNN's
autotuned convolutions, so no ratio credits swalab with an autotuning the reference would have had. The flag
is set around the reference's rounds only and restored after them; swalab's side runs under what its Trainer
sets itself (``run.deterministic``: deterministic algorithms, no autotuning).
swalab's side is ``swalab.trainer.Trainer.fit`` itself (ResidentLoader, channels_last, ``trainer.precision``:
bf16 autocast on CUDA by default, ``run.cuda_graphs``, optionally ``torch.compile``), timed from inside by a
method hook. Both train the same network on the same files on the same machine; the two are interleaved (A, B,
A, B, ...) and medians are compared. Every ratio in the JSON is against this reference.

Usage (CPU, the committed numbers)::

    python bench/throughput.py --device cpu --model preresnet20 --images 1536 --batch-size 128 --rounds 3

GPU (targets: PreResNet-164 and WRN-28-10 >= 3x)::

    python bench/throughput.py --device cuda --model wrn28_10 --images 12800 --batch-size 128 --workers 4 --warmup 5
    python bench/throughput.py --device cuda --model preresnet164 --images 12800 --warmup 5 --compile
    python bench/throughput.py --device cuda --model preresnet164 --images 12800 --warmup 5 --cuda-graphs off

On CUDA ``--warmup`` must exceed the steps the Trainer runs eagerly before it captures its step as a CUDA graph
(``swalab.graphed.WARMUP_STEPS``, 3: the capture happens in every ``fit``, so every round), unless
``--cuda-graphs off``; the script refuses to time the capture.

A non-default variant of swalab's side (``--precision``/``--no-amp``, ``--no-channels-last``, ``--cuda-graphs``,
``--compile``) is written to a file of its own, ``throughput_<model>_<variant>_<device>.json``.

``--data`` may point at the JPEG image folder (``train/<class>/*``) or at a folder holding torchvision's
``cifar-10-batches-py`` pickles (the reference then decodes nothing, as with the original CIFAR).
"""

from __future__ import annotations

import argparse
import contextlib
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
from swalab.graphed import WARMUP_STEPS as GRAPH_WARMUP_STEPS  # noqa: E402
from swalab.precision import training_dtype  # noqa: E402

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


@contextlib.contextmanager
def cudnn_autotuning(device: torch.device):
    """``cudnn.benchmark = True`` (and no deterministic cuDNN algorithms) while the reference runs on CUDA, as the
    paper's training code sets; the previous flags are restored afterwards, so swalab's rounds never inherit them.
    Nothing changes on other devices."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = cudnn.benchmark, cudnn.deterministic
    cudnn.benchmark, cudnn.deterministic = True, False
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = before


def variant_name(args) -> str:
    """The non-default settings of swalab's side, joined for the result file's name ('' for the default)."""
    parts = [f"precision_{args.precision}" if args.precision != "auto" else "",
             "nchw" if args.no_channels_last else "",
             f"cuda_graphs_{args.cuda_graphs}" if args.cuda_graphs != "auto" else "",
             "compile" if args.compile else ""]
    return "_".join(part for part in parts if part)


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
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="swalab side's trainer.precision (auto: bf16 autocast on CUDA, fp32 elsewhere)")
    p.add_argument("--no-amp", action="store_true", help="swalab side in fp32 on CUDA too (= --precision fp32)")
    p.add_argument("--no-channels-last", action="store_true", help="swalab side in the default (NCHW) layout")
    p.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                   help="swalab side's run.cuda_graphs (auto: the Trainer's choice; passed only when not auto)")
    p.add_argument("--out", default=None, help="result file (default bench/results/throughput_<device>.json)")
    args = p.parse_args(argv)
    if args.no_amp:
        if args.precision not in ("auto", "fp32"):
            p.error(f"--no-amp is --precision fp32, not {args.precision}")
        args.precision = "fp32"
    device = pick_device(args.device)
    if device.type == "cuda" and args.cuda_graphs != "off" and args.warmup <= GRAPH_WARMUP_STEPS:
        p.error(f"--warmup {args.warmup}: on CUDA the Trainer captures its step as a graph at step "
                f"{GRAPH_WARMUP_STEPS + 1} of every fit, and the capture must not be timed: use --warmup "
                f"{GRAPH_WARMUP_STEPS + 1} or more, or --cuda-graphs off")
    torch.manual_seed(0)

    dataset, split, fmt = reference_dataset(args.data, args.images)
    ref = ReferenceBench(build_model(args.model), dataset, args.batch_size, args.workers, device, args.warmup)
    ours = TrainerBench(build_model(args.model), split, args.batch_size, device, args.warmup,
                        precision=args.precision, channels_last=not args.no_channels_last, compile=args.compile,
                        cuda_graphs=args.cuda_graphs)
    # The reference loop fed from batches already decoded and augmented in memory: what the reference would
    # reach with a free data pipeline, so swalab's gain splits into data pipeline and compute (layout, compile).
    in_memory = [tuple(b) for b, _ in zip(ref.loader, range(ref.steps))]
    rows = []
    for r in range(args.rounds):
        row = {"round": r, "swalab": ours.run()}
        with cudnn_autotuning(device):
            row["reference"] = ref.run()
            row["reference_in_memory_batches"] = ref.run(in_memory)
        rows.append(row)
        print(f"round {r}: swalab {rows[-1]['swalab']:.1f} img/s, reference {rows[-1]['reference']:.1f} img/s, "
              f"reference on in-memory batches {rows[-1]['reference_in_memory_batches']:.1f} img/s", file=sys.stderr)
    swalab_ips, ref_ips = median([r["swalab"] for r in rows]), median([r["reference"] for r in rows])
    ratio = swalab_ips / ref_ips
    ref_mem_ips = median([r["reference_in_memory_batches"] for r in rows])
    ratios = [r["swalab"] / r["reference"] for r in rows]
    target = GPU_TARGET if device.type == "cuda" else CPU_TARGET
    autocast = training_dtype(device, args.precision)
    payload = {
        "benchmark": "throughput",
        "command": "python bench/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(device),
        "settings": {"model": args.model, "data": args.data, "data_format": fmt, "images": args.images,
                     "batch_size": args.batch_size, "workers": args.workers, "warmup_steps": args.warmup,
                     "timed_steps_per_round": ours.steps - args.warmup, "rounds": args.rounds,
                     "swalab": {"precision": args.precision,
                                "autocast": str(autocast).removeprefix("torch.") if autocast else "float32",
                                "amp_bf16": autocast == torch.bfloat16,
                                "channels_last": not args.no_channels_last, "compile": args.compile,
                                "cuda_graphs": args.cuda_graphs, "deterministic": True},
                     "reference": "PIL RandomCrop(32,4)+RandomHorizontalFlip+ToTensor+Normalize, DataLoader, fp32, "
                                  "cudnn.benchmark=True on CUDA"},
        "reference_cudnn_benchmark": device.type == "cuda",
        "ratios_against": "the reference pipeline above (cudnn.benchmark=True on CUDA), in every ratio and breakdown",
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
    name = "_".join(part for part in ("throughput", "" if args.model == "preresnet20" else args.model,
                                      variant_name(args)) if part)
    write_result(name, device, payload, args.out)
    return payload


if __name__ == "__main__":
    main()
